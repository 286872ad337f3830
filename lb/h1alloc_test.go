package lb

import (
	"io"
	"testing"
)

// TestCommonPathNoAlloc: the checks added against smuggling (bare LF,
// value bytes, target form, hop-by-hop by Connection) cost no allocation
// on the common path: parse a request and a Content-Length response,
// write both heads.
func TestCommonPathNoAlloc(t *testing.T) {
	reqRaw := []byte("GET /index.html?q=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: wrk\r\nAccept: */*\r\nConnection: keep-alive, x-a\r\nX-A: 1\r\n\r\n")
	respRaw := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n")
	var req, resp head
	req.reset()
	resp.reset()
	req.raw = append(make([]byte, 0, 1024), reqRaw...)
	resp.raw = append(make([]byte, 0, 1024), respRaw...)
	bw := newWbuf(io.Discard, 32<<10)
	hc := &h1Conn{bw: bw}
	s := &h1Server{}
	run := func() {
		req.reset()
		req.raw = append(req.raw[:0], reqRaw...)
		if code := req.parseRequest(100); code != 0 {
			t.Fatalf("parseRequest: %d", code)
		}
		resp.reset()
		resp.raw = append(resp.raw[:0], respRaw...)
		if err := resp.parseResponse(); err != nil {
			t.Fatal(err)
		}
		writeRequestHead(bw, &req, "127.0.0.1", false, false)
		s.writeResponseHead(hc, &req, &resp)
		_ = bw.Flush()
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Errorf("%v allocations per request, want 0", n)
	}
}
