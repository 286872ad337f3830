package lb

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

// TestCopyChunkedStrict: every chunk-framing case of issue 15, decoded
// alone; what is accepted is re-encoded canonically and the reader is left
// exactly after the message.
func TestCopyChunkedStrict(t *testing.T) {
	cases := []struct {
		in   string
		want string // re-encoded; "" = refused
	}{
		{"5\r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"},
		{"0000000000000005\r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"},
		{"5;a=b;c\r\nhello\r\n0;x\r\nX-T: 1\r\nY: 2\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"},
		{"5 \r\nhello\r\n0\r\n\r\n", "5\r\nhello\r\n0\r\n\r\n"}, // trailing blanks, as net/http
		{"A\r\n0123456789\r\n0\r\n\r\n", "a\r\n0123456789\r\n0\r\n\r\n"},
		{"00000000000000005\r\nhello\r\n0\r\n\r\n", ""}, // 17 digits
		{"-5\r\nhello\r\n0\r\n\r\n", ""},
		{"+5\r\nhello\r\n0\r\n\r\n", ""},
		{"0x5\r\nhello\r\n0\r\n\r\n", ""},
		{"5 junk\r\nhello\r\n0\r\n\r\n", ""},
		{"5 ;x\r\nhello\r\n0\r\n\r\n", ""}, // net/http refuses it too
		{"\r\nhello\r\n0\r\n\r\n", ""},
		{"5\r\nhelloXX0\r\n\r\n", ""},
		{"5\r\nhello\n0\r\n\r\n", ""},
		{"5\r\nhello\r0\r\n\r\n", ""},
		{"5\r;x\r\nhello\r\n0\r\n\r\n", ""},
		{"5\nhello\r\n0\r\n\r\n", ""},
		{"5;a\nb\r\nhello\r\n0\r\n\r\n", ""},
		{"5\r\nhello\r\n0\r\n\r\r\n", ""},
		{"5\r\nhello\r\n0\r\nX: y\r\r\n\r\n", ""},
		{"5\r\nhello\r\n0\r\nX: y\n\r\n", ""},
		{"5\r\nhello\r\n0\r\nbad\r\n\r\n", ""},
		{"5\r\nhello\r\n0\r\nX: y\r\n folded\r\n\r\n", ""},
		{"5\r\nhello\r\n0\r\nX : y\r\n\r\n", ""},
		{"5\r\nhello\r\n0\r\nX: \x01\r\n\r\n", ""},
		{"5\r\nhel", ""},
		{"5\r\nhello\r\n0\r\n", ""},
		{"1;" + strings.Repeat("e", 4100) + "\r\nx\r\n0\r\n\r\n", ""},                      // line too long
		{strings.Repeat("1;"+strings.Repeat("e", 200)+"\r\nx\r\n", 100) + "0\r\n\r\n", ""}, // too much non-data
	}
	for _, tc := range cases {
		src := bufio.NewReaderSize(strings.NewReader(tc.in+"NEXT"), 64<<10)
		var out bytes.Buffer
		dst := newWbuf(&out, 4096)
		err := copyChunked(dst, src, true, false)
		_ = dst.Flush()
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("%q accepted as %q, want refused", tc.in, out.String())
		case tc.want != "" && err != nil:
			t.Errorf("%q refused: %v", tc.in, err)
		case tc.want != "":
			if out.String() != tc.want {
				t.Errorf("%q re-encoded %q, want %q", tc.in, out.String(), tc.want)
			}
			if rest, _ := src.ReadString(0); rest != "NEXT" {
				t.Errorf("%q left %q, want NEXT", tc.in, rest)
			}
		}
		if err != nil && tc.in != "5\r\nhel" && tc.in != "5\r\nhello\r\n0\r\n" && bodyErrorStatus(err) != 400 {
			t.Errorf("%q: error %v answered %d, want 400", tc.in, err, bodyErrorStatus(err))
		}
	}
}

// TestParseTarget: absolute form routes by its authority (RFC 9112
// §3.2.2) and is forwarded in origin form; other forms are refused.
func TestParseTarget(t *testing.T) {
	cases := []struct {
		raw        string
		code       int
		host, path string
	}{
		{"GET http://good/p?q HTTP/1.1\r\nHost: evil\r\n\r\n", 0, "good", "/p?q"},
		{"GET HTTPS://good:8443 HTTP/1.1\r\nHost: evil\r\n\r\n", 0, "good:8443", "/"},
		{"GET http://good?q HTTP/1.1\r\nHost: evil\r\n\r\n", 0, "good", "/?q"},
		{"GET http://u@good/ HTTP/1.1\r\nHost: evil\r\n\r\n", 400, "", ""},
		{"GET http://go%6fd/ HTTP/1.1\r\nHost: evil\r\n\r\n", 400, "", ""},
		{"GET http:///p HTTP/1.1\r\nHost: evil\r\n\r\n", 400, "", ""},
		{"GET ftp://good/ HTTP/1.1\r\nHost: evil\r\n\r\n", 400, "", ""},
		{"GET good/p HTTP/1.1\r\nHost: evil\r\n\r\n", 400, "", ""},
		{"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400, "", ""},
		{"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 0, "x", "*"},
		{"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "", ""},
		{"GET / HTTP/1.1\r\nHost: x\n\r\n", 400, "", ""},
		{"GET / HTTP/1.1\r\nHost: x\r\nX: a\x7fb\r\n\r\n", 400, "", ""},
	}
	for _, tc := range cases {
		var h head
		h.reset()
		h.raw = []byte(tc.raw)
		code := h.parseRequest(100)
		if code != tc.code {
			t.Errorf("%q: %d, want %d", tc.raw, code, tc.code)
			continue
		}
		if code == 0 && (string(h.host) != tc.host || string(h.uri) != tc.path) {
			t.Errorf("%q: host %q target %q, want %q %q", tc.raw, h.host, h.uri, tc.host, tc.path)
		}
	}
}

// TestDropOnForwardEveryLength: a name listed in Connection is dropped
// whatever its length (the length switch used to return before the list).
func TestDropOnForwardEveryLength(t *testing.T) {
	for _, n := range hopNames("x-z") {
		var h head
		h.reset()
		h.noteConnection([]byte(n))
		if !h.dropOnForward([]byte(n), true) || !h.dropOnForward([]byte(strings.ToUpper(n)), false) {
			t.Errorf("%q (%d chars) listed in Connection is forwarded", n, len(n))
		}
	}
}
