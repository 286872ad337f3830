package lb

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// Parsing for the lean HTTP/1.1 path. Heads are parsed in place from a copy
// of the raw bytes; names and values are sub-slices of that copy, so a
// request costs no allocation once the connection's buffers exist. The
// parser is strict where lenience enables request smuggling: no obs-fold,
// no space before the colon, no Content-Length together with
// Transfer-Encoding, only "chunked" as a transfer coding, none in HTTP/1.0,
// no control bytes in values, and every line ends in CR LF.
//
// Bare LF: refused everywhere (heads, chunk lines, trailers), in requests
// and responses. RFC 9112 §2.2 lets a recipient accept it in a head, but
// not in chunk lines (erratum 7633); one rule for every line means a line
// end is the same thing wherever a peer looks for one, and nothing we
// forward can carry one (heads and chunked framing are written anew).

var (
	errHeadTooLarge = errors.New("lb: header too large")
	errMalformed    = errors.New("lb: malformed message")
)

type hdr struct{ name, value []byte }

// head is a parsed request or response head.
type head struct {
	raw       []byte // owned copy of the head bytes
	hdrs      []hdr
	method    []byte // request
	uri       []byte // request
	minor     int    // HTTP/1.minor
	status    int    // response
	reason    []byte // response
	host      []byte
	length    int64 // -1 when absent
	chunked   bool
	close     bool // Connection: close
	keepAlive bool // Connection: keep-alive (HTTP/1.0)
	upgrade   bool // Connection: upgrade
	upgradeTo []byte
	expect100 bool
	xff       [][]byte
	connToks  [][]byte // other Connection tokens: headers to drop
}

func (h *head) reset() {
	h.raw, h.hdrs = h.raw[:0], h.hdrs[:0]
	h.method, h.uri, h.reason, h.host, h.upgradeTo = nil, nil, nil, nil, nil
	h.minor, h.status, h.length = 1, 0, -1
	h.chunked, h.close, h.keepAlive, h.upgrade, h.expect100 = false, false, false, false, false
	h.xff, h.connToks = h.xff[:0], h.connToks[:0]
}

// headBuffered reports whether br already holds a complete head.
func headBuffered(br *bufio.Reader) bool {
	buf, _ := br.Peek(br.Buffered())
	return headEnd(buf, 0) > 0
}

// readHead waits for a complete head (up to the blank line) in br and
// copies it into dst. It fails with errHeadTooLarge when limit bytes (or the
// reader's buffer) fill without one.
func readHead(br *bufio.Reader, limit int, dst []byte) ([]byte, error) {
	scan := 0
	for {
		n := br.Buffered()
		if n == 0 {
			if _, err := br.Peek(1); err != nil {
				return nil, err
			}
			continue
		}
		buf, _ := br.Peek(n)
		if end := headEnd(buf, scan); end > 0 {
			if end > limit {
				return nil, errHeadTooLarge
			}
			dst = append(dst[:0], buf[:end]...)
			_, _ = br.Discard(end)
			return dst, nil
		}
		if n >= limit || n >= br.Size() {
			return nil, errHeadTooLarge
		}
		scan = max(0, n-3)
		if _, err := br.Peek(n + 1); err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, errHeadTooLarge
			}
			return nil, err
		}
	}
}

// headEnd returns the length of the head including its terminating blank
// line (CRLF CRLF, or bare LF LF), or 0 when not complete.
func headEnd(b []byte, from int) int {
	for i := from; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if i+1 < len(b) && b[i+1] == '\n' {
			return i + 2
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			return i + 3
		}
	}
	return 0
}

// nextLine splits off one line without its CR LF.
func nextLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return b, nil
	}
	line, rest = b[:i], b[i+1:]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, rest
}

// parseRequest parses h.raw as a request head. It returns 0, or the status
// to answer with (400, 431, 501, 505).
func (h *head) parseRequest(maxCount int) int {
	b := h.raw
	for len(b) >= 2 && b[0] == '\r' && b[1] == '\n' {
		b = b[2:] // RFC 9112 §2.3: ignore empty lines before the request line
	}
	if hasBareLF(b) {
		return 400
	}
	line, rest := nextLine(b)
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return 400
	}
	h.method = line[:sp1]
	line = line[sp1+1:]
	sp2 := bytes.IndexByte(line, ' ')
	if sp2 <= 0 {
		return 400
	}
	h.uri, line = line[:sp2], line[sp2+1:]
	switch string(line) {
	case "HTTP/1.1":
		h.minor = 1
	case "HTTP/1.0":
		h.minor = 0
	default:
		if bytes.HasPrefix(line, []byte("HTTP/")) {
			return 505
		}
		return 400
	}
	if !isToken(h.method) || !validURI(h.uri) {
		return 400
	}
	if string(h.method) == "CONNECT" {
		return 405 // a reverse proxy opens no tunnels
	}
	if code := h.parseFields(rest, maxCount, true); code != 0 {
		return code
	}
	if h.minor == 1 && h.host == nil {
		return 400
	}
	if h.chunked && h.minor == 0 {
		// RFC 9112 §6.1: an HTTP/1.0 sender cannot mean chunked, so the
		// framing is in doubt; refused rather than guessed at.
		return 400
	}
	return h.parseTarget()
}

// parseTarget checks the request-target's form (RFC 9112 §3.2): origin
// form, "*" for OPTIONS, or absolute form with an http(s) authority, which
// then replaces Host (§3.2.2: the target's authority wins) and is forwarded
// in origin form, so the backend cannot see another host than we route by.
func (h *head) parseTarget() int {
	u := h.uri
	switch {
	case u[0] == '/':
		return 0
	case len(u) == 1 && u[0] == '*':
		if string(h.method) != "OPTIONS" {
			return 400
		}
		return 0
	}
	var rest []byte
	switch {
	case len(u) > 7 && eqFold(u[:7], "http://"):
		rest = u[7:]
	case len(u) > 8 && eqFold(u[:8], "https://"):
		rest = u[8:]
	default:
		return 400
	}
	end := len(rest)
	if i := bytes.IndexAny(rest, "/?#"); i >= 0 {
		end = i
	}
	auth := rest[:end]
	if len(auth) == 0 || bytes.ContainsAny(auth, "@%") {
		// No host, userinfo (RFC 9110 §4.2.4: not to be sent), or an
		// escaped host, which peers would decode differently.
		return 400
	}
	h.host = auth
	switch path := rest[end:]; {
	case len(path) == 0:
		h.uri = slashURI
	case path[0] == '/':
		h.uri = path
	case path[0] == '?':
		h.uri = append([]byte{'/'}, path...) // rare: allocates
	default:
		return 400 // a fragment is not part of a request-target
	}
	return 0
}

var slashURI = []byte("/")

// hasBareLF reports a LF not preceded by CR.
func hasBareLF(b []byte) bool {
	for i := 0; ; i++ {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return false
		}
		i += j
		if i == 0 || b[i-1] != '\r' {
			return true
		}
	}
}

// parseResponse parses h.raw as a response head.
func (h *head) parseResponse() error {
	if hasBareLF(h.raw) {
		return fmt.Errorf("%w: bare LF in the head", errMalformed)
	}
	line, rest := nextLine(h.raw)
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' ||
		line[7] < '0' || line[7] > '9' || len(line) > 12 && line[12] != ' ' {
		return fmt.Errorf("%w: status line %q", errMalformed, trimLine(line))
	}
	h.minor = int(line[7] - '0')
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil || code < 100 || code > 599 {
		return fmt.Errorf("%w: status %q", errMalformed, line[9:12])
	}
	h.status = code
	if len(line) > 13 {
		h.reason = line[13:]
	}
	if c := h.parseFields(rest, 1000, false); c != 0 {
		return fmt.Errorf("%w: header fields", errMalformed)
	}
	if h.minor == 0 && !h.keepAlive {
		h.close = true
	}
	if h.chunked && h.minor == 0 {
		// As in a request (RFC 9112 §6.1): net/http would read the
		// framing as the body, another peer would decode it.
		return fmt.Errorf("%w: Transfer-Encoding in HTTP/1.0", errMalformed)
	}
	return nil
}

// parseFields parses header lines and notes the ones that steer framing.
func (h *head) parseFields(b []byte, maxCount int, request bool) int {
	for len(b) > 0 {
		var line []byte
		line, b = nextLine(b)
		if len(line) == 0 {
			break
		}
		name, value, ok := parseFieldLine(line)
		if !ok {
			return 400
		}
		if len(h.hdrs) >= maxCount {
			return 431
		}
		h.hdrs = append(h.hdrs, hdr{name, value})
		if code := h.noteField(name, value, request); code != 0 {
			return code
		}
	}
	if h.chunked && h.length >= 0 {
		if request {
			return 400
		}
		h.length = -1 // RFC 9112 §6.3: Transfer-Encoding wins in a response
	}
	return 0
}

// parseFieldLine splits a field line (without its CR LF) into name and
// value: no obs-fold, a token name directly followed by the colon, and a
// value of visible bytes, spaces and tabs (obs-text allowed) as net/http.
func parseFieldLine(line []byte) (name, value []byte, ok bool) {
	if line[0] == ' ' || line[0] == '\t' {
		return nil, nil, false // obsolete line folding
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 || !isToken(line[:colon]) {
		return nil, nil, false
	}
	name, value = line[:colon], trimOWS(line[colon+1:])
	for _, c := range value {
		if !valueChars[c] {
			return nil, nil, false
		}
	}
	return name, value, true
}

func (h *head) noteField(name, value []byte, request bool) int {
	switch {
	case eqFold(name, "host"):
		if request && h.host != nil {
			return 400
		}
		h.host = value
	case eqFold(name, "content-length"):
		n, ok := parseLength(value)
		if !ok || (h.length >= 0 && h.length != n) {
			return 400
		}
		h.length = n
	case eqFold(name, "transfer-encoding"):
		if !eqFold(value, "chunked") || h.chunked {
			return 501
		}
		h.chunked = true
	case eqFold(name, "connection"):
		h.noteConnection(value)
	case eqFold(name, "upgrade"):
		h.upgradeTo = value
	case eqFold(name, "expect"):
		h.expect100 = eqFold(value, "100-continue")
	case eqFold(name, "x-forwarded-for"):
		h.xff = append(h.xff, value)
	}
	return 0
}

func (h *head) noteConnection(v []byte) {
	for len(v) > 0 {
		var tok []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			tok, v = v, nil
		}
		tok = trimOWS(tok)
		switch {
		case len(tok) == 0:
		case eqFold(tok, "close"):
			h.close = true
		case eqFold(tok, "keep-alive"):
			h.keepAlive = true
		case eqFold(tok, "upgrade"):
			h.upgrade = true
		default:
			h.connToks = append(h.connToks, tok)
		}
	}
}

// dropOnForward reports headers a proxy must not forward (RFC 9110
// §7.6.1): the fixed hop-by-hop set, the framing and forwarding headers the
// proxy writes itself, and every name the Connection header lists, whatever
// its length (the length switch only picks which fixed names to compare).
func (h *head) dropOnForward(name []byte, request bool) bool {
	if fixedHopByHop(name, request) {
		return true
	}
	for _, t := range h.connToks {
		if bytes.EqualFold(name, t) {
			return true
		}
	}
	return false
}

func fixedHopByHop(name []byte, request bool) bool {
	switch len(name) {
	case 2:
		return eqFold(name, "te")
	case 4:
		return request && eqFold(name, "host")
	case 6:
		return request && eqFold(name, "expect")
	case 7:
		return eqFold(name, "trailer") || eqFold(name, "upgrade")
	case 9:
		return request && eqFold(name, "x-real-ip")
	case 10:
		return eqFold(name, "connection") || eqFold(name, "keep-alive")
	case 14:
		return eqFold(name, "content-length")
	case 15:
		return request && eqFold(name, "x-forwarded-for")
	case 16:
		return eqFold(name, "proxy-connection") || request && eqFold(name, "x-forwarded-host")
	case 17:
		return eqFold(name, "transfer-encoding") || request && eqFold(name, "x-forwarded-proto")
	case 18:
		return eqFold(name, "proxy-authenticate")
	case 19:
		return eqFold(name, "proxy-authorization")
	}
	return false
}

func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// eqFold compares b with a lowercase ASCII string, ignoring case.
func eqFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// valueChars: bytes allowed in a field value (RFC 9110 §5.5: VCHAR, SP,
// HTAB, obs-text); no CR, LF, NUL or other control byte reaches a backend.
var valueChars = func() (t [256]bool) {
	for c := 0x20; c < 0x100; c++ {
		t[c] = c != 0x7f
	}
	t['\t'] = true
	return t
}()

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return true
}

func validURI(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	return len(b) > 0
}
