package lb

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"
	"testing"
)

// Differential fuzzing of the fast engine's parsers against the standard
// library's (http.ReadRequest, http.ReadResponse, the chunked reader): the
// same bytes must be accepted or refused alike, end at the same byte and
// give the same body. The seeds (testdata/fuzz/<Fuzz...>/ and the cases
// below) hold every case of issue 15 and the classic smuggling set.
//
// Deliberate differences, where we refuse what net/http accepts (never the
// other way round, except leading empty lines):
//   - bare LF as a line end in a head or trailer (our one rule: see h1parse.go);
//   - obs-fold (net/http unfolds it);
//   - field names that are not tokens (net/http's ReadResponse keeps
//     "T 0:" as a name; found by FuzzResponse, in the corpus);
//   - Transfer-Encoding in HTTP/1.0 (net/http ignores the header, Go issue
//     12785, and reads the chunked framing as the next message or the body);
//   - Content-Length together with Transfer-Encoding in a request;
//   - the rules net/http's server, not ReadRequest, applies: Host required
//     in HTTP/1.1, at most one Host;
//   - request-targets other than origin form, "*" for OPTIONS, or an
//     http(s) absolute form without userinfo or fragment; CONNECT (405);
//     versions other than HTTP/1.0 and 1.1;
//   - status codes outside 100-599, status lines net/http trims;
//   - a Content-Length of more than 18 digits.
// And where net/http refuses what we accept: a request-target that does
// not parse as a URL (we forward it as received: net/http checks escapes
// and authorities); empty lines before the request line (RFC 9112 §2.2
// lets a server ignore them; net/http's server does, ReadRequest not).

const fuzzBuf = 64 << 10

type parsed struct {
	ok   bool
	end  int // bytes consumed
	body []byte
	host string
}

func consumed(data []byte, r *bytes.Reader, br *bufio.Reader) int {
	return len(data) - r.Len() - br.Buffered()
}

func oursRequest(data []byte) parsed {
	r := bytes.NewReader(data)
	br := bufio.NewReaderSize(r, fuzzBuf)
	raw, err := readHead(br, fuzzBuf, nil)
	if err != nil {
		return parsed{}
	}
	var h head
	h.reset()
	h.raw = raw
	if h.parseRequest(1000) != 0 {
		return parsed{}
	}
	var out bytes.Buffer
	dst := newWbuf(&out, 4096)
	switch {
	case h.chunked:
		err = copyChunked(dst, br, false, false)
	case h.length > 0:
		err = copyN(dst, br, h.length)
	}
	if err != nil || dst.Flush() != nil {
		return parsed{}
	}
	return parsed{ok: true, end: consumed(data, r, br), body: out.Bytes(), host: string(h.host)}
}

func stdRequest(data []byte) (parsed, *http.Request) {
	r := bytes.NewReader(data)
	br := bufio.NewReaderSize(r, fuzzBuf)
	req, err := http.ReadRequest(br)
	if err != nil {
		return parsed{}, nil
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return parsed{}, req
	}
	return parsed{ok: true, end: consumed(data, r, br), body: body, host: req.Host}, req
}

// headOf is data up to its first blank line (or all of it).
func headOf(data []byte) []byte {
	if i := headEnd(data, 0); i > 0 {
		return data[:i]
	}
	return data
}

// knownRequestDifference names the deliberate difference that explains
// ours refusing what net/http accepted (req), or "".
func knownRequestDifference(data []byte, req *http.Request) string {
	hd := headOf(data)
	var h head
	h.reset()
	h.raw = hd
	switch {
	case hasBareLF(hd):
		return "bare LF in the head"
	case bytes.Contains(hd, []byte("\n ")) || bytes.Contains(hd, []byte("\n\t")):
		return "obs-fold"
	case badFieldName(hd):
		return "field name not a token"
	case req == nil:
		return ""
	case len(req.Trailer) > 0 || bytes.Contains(data[len(hd):], []byte("\n\t")) || bytes.Contains(data[len(hd):], []byte("\n ")):
		return "trailer section parsed by textproto (bare LF, obs-fold)"
	case req.ProtoMinor == 0 && bytes.Contains(bytes.ToLower(hd), []byte("transfer-encoding")):
		return "Transfer-Encoding in HTTP/1.0"
	case len(req.TransferEncoding) > 0 && bytes.Contains(bytes.ToLower(hd), []byte("content-length")):
		return "Content-Length with Transfer-Encoding"
	case req.ProtoMinor == 1 && len(req.Header["Host"]) != 1:
		return "Host rules of net/http's server"
	case req.Method == "CONNECT":
		return "CONNECT"
	case req.Proto != "HTTP/1.0" && req.Proto != "HTTP/1.1":
		return "version"
	case req.RequestURI == "" || req.RequestURI[0] != '/':
		return "request-target form"
	}
	for _, v := range req.Header["Content-Length"] {
		if len(strings.TrimLeft(v, "0")) > 18 || len(v) > 18 {
			return "Content-Length digits"
		}
	}
	return ""
}

// knownRequestLenience names what we accept and net/http refuses, or "".
func knownRequestLenience(data []byte) string {
	if bytes.HasPrefix(data, []byte("\r\n")) {
		return "empty line before the request line"
	}
	line, _, _ := bytes.Cut(data, []byte("\r\n"))
	if parts := bytes.Split(line, []byte(" ")); len(parts) == 3 {
		// The target alone, as net/http parses it.
		probe := "GET " + string(parts[1]) + " HTTP/1.1\r\nHost: x\r\n\r\n"
		if _, err := http.ReadRequest(bufio.NewReader(strings.NewReader(probe))); err != nil {
			return "request-target net/http parses as a URL"
		}
	}
	return ""
}

func FuzzRequest(f *testing.F) {
	for _, s := range requestSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ours := oursRequest(data)
		std, req := stdRequest(data)
		switch {
		case ours.ok && !std.ok:
			if knownRequestLenience(data) == "" {
				t.Fatalf("we accept what net/http refuses: %q", data)
			}
		case !ours.ok && std.ok:
			if knownRequestDifference(data, req) == "" {
				t.Fatalf("we refuse what net/http accepts: %q", data)
			}
		case ours.ok && std.ok:
			if ours.end != std.end {
				t.Fatalf("message end: ours %d, net/http %d: %q", ours.end, std.end, data)
			}
			if !bytes.Equal(ours.body, std.body) {
				t.Fatalf("body: ours %q, net/http %q: %q", ours.body, std.body, data)
			}
			if ours.host != std.host {
				t.Fatalf("host: ours %q, net/http %q: %q", ours.host, std.host, data)
			}
		}
	})
}

func oursResponse(data []byte) parsed {
	r := bytes.NewReader(data)
	br := bufio.NewReaderSize(r, fuzzBuf)
	raw, err := readHead(br, fuzzBuf, nil)
	if err != nil {
		return parsed{}
	}
	var resp head
	resp.reset()
	resp.raw = raw
	if resp.parseResponse() != nil {
		return parsed{}
	}
	var req head
	req.reset()
	req.method = []byte("GET")
	var out bytes.Buffer
	dst := newWbuf(&out, 4096)
	if !hasBody(&req, &resp) {
		return parsed{ok: true, end: consumed(data, r, br)}
	}
	switch {
	case resp.length >= 0:
		err = copyN(dst, br, resp.length)
	case resp.chunked:
		err = copyChunked(dst, br, false, false)
	default:
		err = copyAll(dst, br)
	}
	if err != nil || dst.Flush() != nil {
		return parsed{}
	}
	return parsed{ok: true, end: consumed(data, r, br), body: out.Bytes()}
}

func stdResponse(data []byte) (parsed, *http.Response) {
	r := bytes.NewReader(data)
	br := bufio.NewReaderSize(r, fuzzBuf)
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil {
		return parsed{}, nil
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return parsed{}, resp
	}
	return parsed{ok: true, end: consumed(data, r, br), body: body}, resp
}

// badFieldName reports a field line in the head whose name is not a
// token followed directly by the colon.
func badFieldName(hd []byte) bool {
	lines := bytes.Split(hd, []byte("\r\n"))
	for _, l := range lines[1:] {
		if len(l) == 0 || l[0] == ' ' || l[0] == '\t' {
			continue
		}
		name, _, ok := bytes.Cut(l, []byte(":"))
		if !ok || !isToken(name) {
			return true
		}
	}
	return false
}

func knownResponseDifference(data []byte, resp *http.Response) string {
	hd := headOf(data)
	switch {
	case hasBareLF(hd):
		return "bare LF in the head"
	case badFieldName(hd):
		return "field name not a token"
	case bytes.Contains(hd, []byte("\n ")) || bytes.Contains(hd, []byte("\n\t")):
		return "obs-fold"
	case resp == nil:
		return ""
	case len(resp.Trailer) > 0 || bytes.Contains(data[len(hd):], []byte("\n\t")) || bytes.Contains(data[len(hd):], []byte("\n ")):
		return "trailer section parsed by textproto (bare LF, obs-fold)"
	case resp.ProtoMajor != 1:
		return "version"
	case resp.StatusCode < 100 || resp.StatusCode > 599:
		return "status code range"
	case resp.ProtoMinor == 0 && bytes.Contains(bytes.ToLower(hd), []byte("transfer-encoding")):
		return "Transfer-Encoding in HTTP/1.0"
	case !bytes.HasPrefix(hd, []byte("HTTP/1.")) || len(hd) > 12 && hd[8] == ' ' && hd[9] == ' ':
		return "status line net/http trims"
	}
	line, _, _ := bytes.Cut(hd, []byte("\r\n"))
	if len(line) > 12 && line[12] != ' ' || len(line) >= 9 && line[8] != ' ' {
		return "status line net/http trims"
	}
	for _, v := range resp.Header["Content-Length"] {
		if len(v) > 18 {
			return "Content-Length digits"
		}
	}
	return ""
}

func FuzzResponse(f *testing.F) {
	for _, s := range responseSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ours := oursResponse(data)
		std, resp := stdResponse(data)
		switch {
		case ours.ok && !std.ok:
			t.Fatalf("we accept what net/http refuses: %q", data)
		case !ours.ok && std.ok:
			if knownResponseDifference(data, resp) == "" {
				t.Fatalf("we refuse what net/http accepts: %q", data)
			}
		case ours.ok && std.ok:
			if ours.end != std.end {
				t.Fatalf("message end: ours %d, net/http %d: %q", ours.end, std.end, data)
			}
			if !bytes.Equal(ours.body, std.body) {
				t.Fatalf("body: ours %q, net/http %q: %q", ours.body, std.body, data)
			}
		}
	})
}

// FuzzChunked compares the chunked decoder alone with
// httputil.NewChunkedReader followed by net/http's trailer rule (a bare
// CR LF, or header fields up to a blank line).
func FuzzChunked(f *testing.F) {
	for _, s := range chunkedSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Ours, decoding to plain data.
		r1 := bytes.NewReader(data)
		br1 := bufio.NewReaderSize(r1, fuzzBuf)
		var out bytes.Buffer
		dst := newWbuf(&out, 4096)
		oerr := copyChunked(dst, br1, false, false)
		_ = dst.Flush()
		// The standard library's, through a request so that trailers are
		// read as net/http reads them.
		in := append([]byte("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"), data...)
		std, req := stdRequest(in)
		// And its bare chunked reader, for the data.
		r2 := bytes.NewReader(data)
		br2 := bufio.NewReaderSize(r2, fuzzBuf)
		cbody, cerr := io.ReadAll(httputil.NewChunkedReader(br2))
		switch {
		case oerr == nil && !std.ok:
			t.Fatalf("we accept what net/http refuses: %q", data)
		case oerr != nil && std.ok:
			if req == nil || len(req.Trailer) == 0 && !bytes.Contains(data, []byte("\n\t")) && !bytes.Contains(data, []byte("\n ")) && !bytes.Contains(data, []byte("\n\n")) && !hasBareLF(data) {
				t.Fatalf("we refuse what net/http accepts (%v): %q", oerr, data)
			}
		case oerr == nil:
			if end := consumed(data, r1, br1) + len(in) - len(data); end != std.end {
				t.Fatalf("message end: ours %d, net/http %d: %q", end, std.end, data)
			}
			if !bytes.Equal(out.Bytes(), std.body) {
				t.Fatalf("body: ours %q, net/http %q: %q", out.Bytes(), std.body, data)
			}
			if cerr == nil && !bytes.Equal(out.Bytes(), cbody) {
				t.Fatalf("body: ours %q, chunked reader %q: %q", out.Bytes(), cbody, data)
			}
		}
	})
}

func chunkedSeeds() []string {
	return []string{
		"5\r\nhello\r\n0\r\n\r\n",
		"5;a=b\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"0000000000000005\r\nhello\r\n0\r\n\r\n",
		"00000000000000005\r\nhello\r\n0\r\n\r\n",
		"-5\r\nhello\r\n0\r\n\r\n", "+5\r\nhello\r\n0\r\n\r\n", "0x5\r\nhello\r\n0\r\n\r\n",
		"5 junk\r\nhello\r\n0\r\n\r\n", "5 \r\nhello\r\n0\r\n\r\n", "5 ;x\r\nhello\r\n0\r\n\r\n",
		"5\r\nhelloXX0\r\n\r\n", "5\r\nhello\n0\r\n\r\n", "5\r;x\r\nhello\r\n0\r\n\r\n",
		"5\nhello\r\n0\r\n\r\n", "2;\nxx\r\nAB\r\n" + smuggledIn171() + "\r\n0\r\n\r\n",
		"5\r\nhello\r\n0\r\n\r\r\n", "5\r\nhello\r\n0\r\nbad\r\n\r\n", "5\r\nhello\r\n0\r\nX: y\n\r\n",
		"5\r\nhello\r\n0\r\nX: y\r\n z\r\n\r\n", "1;" + strings.Repeat("e", 5000) + "\r\nx\r\n0\r\n\r\n",
		"5\r\nhel", "0\r\n", "\r\n", "ffffffffffffffff\r\n",
	}
}

func requestSeeds() []string {
	var s []string
	for _, c := range chunkedSeeds() {
		s = append(s, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"+c)
	}
	for _, tc := range smuggleCases() {
		s = append(s, tc.raw)
	}
	return append(s,
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked \r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding\r\n : chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nX: \x00\r\n\r\n",
		"GET http://a:80/p?q HTTP/1.1\r\nHost: b\r\n\r\n",
		"GET http://a?q HTTP/1.1\r\nHost: b\r\n\r\n",
		"GET https://u@a/ HTTP/1.1\r\nHost: b\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
		"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nConnection: x-a\r\nX-A: 1\r\n\r\n",
	)
}

func responseSeeds() []string {
	var s []string
	for _, c := range chunkedSeeds() {
		s = append(s, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+c)
	}
	return append(s,
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\n\r\nclose-delimited",
		"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
		"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nConnection: x-a\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n",
	)
}
