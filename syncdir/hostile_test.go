package syncdir

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hapair/hapair/internal/config"
)

// hostileClient talks to a receiver with a valid client certificate.
type hostileClient struct {
	t    *testing.T
	addr string
	tls  *tls.Config
	c    *http.Client
}

func newHostileClient(t *testing.T, p *pki, addr string) *hostileClient {
	cert, err := tls.LoadX509KeyPair(p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.CACert)
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "127.0.0.1"}
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &hostileClient{t: t, addr: addr, tls: tc, c: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// do sends one request; rawURL is appended to https://addr as is.
func (h *hostileClient) do(method, rawURL string, epoch string, body string) int {
	h.t.Helper()
	req, err := http.NewRequest(method, "https://"+h.addr+rawURL, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if epoch != "" {
		req.Header.Set(hdrEpoch, epoch)
	}
	req.Header.Set(hdrNode, "attacker")
	resp, err := h.c.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, rawURL, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// raw writes bytes on a fresh TLS connection and returns the status line.
func (h *hostileClient) raw(payload []byte, closeEarly bool) string {
	h.t.Helper()
	tc := h.tls.Clone()
	tc.NextProtos = []string{"http/1.1"}
	c, err := tls.Dial("tcp", h.addr, tc)
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(payload)
	if closeEarly {
		return ""
	}
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

// Must show 4: hostile input is refused, nothing lands outside the root,
// and the receiver keeps serving.
func TestHostileInput(t *testing.T) {
	_, b, p := pair(t)
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "secret"), "untouched", 0o644)
	os.MkdirAll(filepath.Join(b.root, "sub"), 0o755)
	os.Symlink(outside, filepath.Join(b.root, "evil"))
	os.Symlink("sub", filepath.Join(b.root, "inner"))
	h := newHostileClient(t, p, b.ln.Addr().String())

	put := func(q string) string { return "/v1/put/data?" + q + "&mode=644&mtime=0" }
	if st := h.do("PUT", put("path=ok.txt"), "10", "fine"); st != 200 {
		t.Fatalf("valid put: %d", st)
	}
	cases := []struct {
		name, method, url, epoch, reason string
	}{
		{"dotdot", "PUT", put("path=../escape"), "10", "traversal"},
		{"inner dotdot", "PUT", put("path=sub/../../escape"), "10", "traversal"},
		{"absolute", "PUT", put("path=/tmp/escape"), "10", "absolute"},
		{"encoded dotdot", "PUT", put("path=%2e%2e%2fescape"), "10", "traversal"},
		{"half encoded", "PUT", put("path=..%2fescape"), "10", "traversal"},
		{"encoded absolute", "PUT", put("path=%2fetc%2fescape"), "10", "absolute"},
		{"nul", "PUT", put("path=a%00b"), "10", "nul"},
		{"dot", "PUT", put("path=./x"), "10", "bad-path"},
		{"double slash", "PUT", put("path=sub//x"), "10", "bad-path"},
		{"quarantine", "PUT", put("path=.hapair-quarantine/10/x"), "10", "reserved"},
		{"temp name", "PUT", put("path=.hapair-tmp-1234"), "10", "reserved"},
		{"symlink escape", "PUT", put("path=evil/secret"), "10", "symlink-parent"},
		{"symlink inside", "PUT", put("path=inner/x"), "10", "symlink-parent"},
		{"mkdir via link", "POST", "/v1/mkdir/data?path=evil/d&mode=755", "10", "symlink-parent"},
		{"delete via link", "POST", "/v1/delete/data?path=evil/secret", "10", "symlink-parent"},
		{"rename via link", "POST", "/v1/rename/data?path=ok.txt&to=evil/secret", "10", "symlink-parent"},
		{"rename out", "POST", "/v1/rename/data?path=ok.txt&to=../x", "10", "traversal"},
		{"lower epoch", "PUT", put("path=late.txt"), "3", "stale-epoch"},
		{"no epoch", "PUT", put("path=x"), "", "no-epoch"},
		{"bad epoch", "PUT", put("path=x"), "-1", "no-epoch"},
		{"unknown root", "PUT", "/v1/put/other?path=x&mode=644&mtime=0", "10", "unknown-root"},
		{"unknown op", "POST", "/v1/chown/data?path=x", "10", "bad-request"},
		{"repeated path", "PUT", put("path=x&path=../y"), "10", "bad-request"},
		{"excluded", "PUT", put("path=cache/x"), "10", "excluded"},
	}
	for _, c := range cases {
		before := b.s.Status().Rejected[c.reason]
		if st := h.do(c.method, c.url, c.epoch, "payload"); st == 200 {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if after := b.s.Status().Rejected[c.reason]; after != before+1 {
			t.Errorf("%s: rejected[%s] went %d -> %d (%v)", c.name, c.reason, before, after, b.s.Status().Rejected)
		}
	}

	// A double-encoded name is just an odd file name inside the root.
	if st := h.do("PUT", put("path=%252e%252e%252fodd"), "10", "odd"); st != 200 {
		t.Fatalf("double-encoded name: %d", st)
	}
	if readFile(filepath.Join(b.root, "%2e%2e%2fodd")) != "odd" {
		t.Fatal("double-encoded name not stored literally")
	}
	// Replacing the link itself writes a file in its place, never through it.
	if st := h.do("PUT", put("path=evil"), "10", "not through"); st != 200 {
		t.Fatalf("put over a symlink: %d", st)
	}
	if fi, err := os.Lstat(filepath.Join(b.root, "evil")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("symlink not replaced by a file: %v", err)
	}

	// Oversized headers.
	big := "PUT " + put("path=big") + " HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", 200<<10) + "\r\n\r\n"
	if line := h.raw([]byte(big), false); !strings.Contains(line, "431") {
		t.Errorf("oversized header answered %q", line)
	}
	// Truncated body: the connection dies after 10 of 100000 bytes.
	errsBefore := b.s.Status().Errors["recv-truncated"]
	trunc := fmt.Sprintf("PUT %s HTTP/1.1\r\nHost: x\r\n%s: 10\r\n%s: attacker\r\nContent-Length: 100000\r\n\r\n0123456789",
		put("path=trunc.bin"), hdrEpoch, hdrNode)
	h.raw([]byte(trunc), true)
	eventually(t, 10*time.Second, "truncated put to fail", func() bool {
		return b.s.Status().Errors["recv-truncated"] > errsBefore
	})
	if fileExists(filepath.Join(b.root, "trunc.bin")) {
		t.Fatal("truncated file visible under its final name")
	}

	// No client certificate, or one from another CA: the handshake fails.
	for name, certs := range map[string][]tls.Certificate{"none": nil, "rogue": {mustPair(t, p.OtherCert, p.OtherKey)}} {
		tc := h.tls.Clone()
		tc.Certificates = certs
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}, Timeout: 5 * time.Second}
		req, _ := http.NewRequest("PUT", "https://"+h.addr+put("path=nocert"), strings.NewReader("x"))
		req.Header.Set(hdrEpoch, "10")
		req.Header.Set(hdrNode, "attacker")
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("client certificate %s: request got %d", name, resp.StatusCode)
		}
	}
	if fileExists(filepath.Join(b.root, "nocert")) {
		t.Fatal("unauthenticated put applied")
	}

	// Nothing outside the root, no temp files left, still serving.
	entries, _ := os.ReadDir(outside)
	if len(entries) != 1 || readFile(filepath.Join(outside, "secret")) != "untouched" {
		t.Fatalf("outside the root changed: %v", entries)
	}
	if fileExists(filepath.Join(filepath.Dir(b.root), "escape")) {
		t.Fatal("escape file written next to the root")
	}
	filepath.WalkDir(b.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), tempPrefix) {
			t.Errorf("temp file left behind: %s", p)
		}
		return nil
	})
	if st := h.do("PUT", put("path=still-serving.txt"), "10", "yes"); st != 200 {
		t.Fatalf("receiver stopped serving: %d", st)
	}
}

func mustPair(t *testing.T, cert, key string) tls.Certificate {
	c, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The receiver refuses pushes while its node holds the active key.
func TestReceiverRefusesWhileHolding(t *testing.T) {
	_, b, p := pair(t)
	b.fence.set(true, 50)
	h := newHostileClient(t, p, b.ln.Addr().String())
	if st := h.do("PUT", "/v1/put/data?path=x&mode=644&mtime=0", "60", "x"); st != http.StatusConflict {
		t.Fatalf("push to a holding node: %d", st)
	}
	if b.s.Status().Rejected["holding"] != 1 || fileExists(filepath.Join(b.root, "x")) {
		t.Fatal("push not refused as holding")
	}
}

// No authentication is a config error unless insecure is set.
func TestConfigRequiresAuth(t *testing.T) {
	p := newPKI(t)
	cfg := testConfig(p, "a", "/srv/data", "/var/lib/x", "127.0.0.1:7402")
	cfg.TLS.CAFile = ""
	err := cfg.Validate()
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.Field != "sync.tls.ca-file" {
		t.Fatalf("want a sync.tls.ca-file error, got %v", err)
	}
	cfg.TLS = config.TLS{}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "sync.tls.cert-file") {
		t.Fatalf("want a sync.tls.cert-file error, got %v", err)
	}
	cfg.Insecure = true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("insecure: %v", err)
	}
	cfg.Roots[0].Path = "relative"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "sync.roots[0].path") {
		t.Fatalf("want a sync.roots[0].path error, got %v", err)
	}
	d := DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults (no roots: sync off): %v", err)
	}
}

// FuzzDecodeRequest feeds raw HTTP requests to the receiver's decoder: it
// must never panic, and whatever it accepts must be confined to the root.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte("PUT /v1/put/data?path=a/b&mode=644&mtime=1 HTTP/1.1\r\nHost: x\r\nX-Hapair-Epoch: 1\r\nX-Hapair-Node: a\r\nContent-Length: 0\r\n\r\n"))
	f.Add([]byte("PUT /v1/put/data?path=a&mode=644&mtime=1&stream=1 HTTP/1.1\r\nHost: x\r\nX-Hapair-Epoch: 1\r\nX-Hapair-Node: a\r\nTransfer-Encoding: chunked\r\nTrailer: X-Hapair-Size\r\n\r\n2\r\nhi\r\n0\r\nX-Hapair-Size: 2\r\n\r\n"))
	f.Add([]byte("PUT /v1/batch/data?n=2 HTTP/1.1\r\nHost: x\r\nX-Hapair-Epoch: 1\r\nX-Hapair-Node: a\r\nContent-Length: 72\r\n\r\n" +
		"path=a&mode=644&mtime=1&size=2\nhipath=..%2fb&mode=644&mtime=1&size=3\nbad"))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		if err != nil {
			return
		}
		q, err := decodeRequest(req)
		if err != nil {
			return
		}
		if q.epoch <= 0 || q.node == "" {
			t.Fatalf("accepted without fence data: %+v", q)
		}
		switch q.op {
		case opManifest:
			return
		case opBatch:
			fuzzBatchBody(t, req, q)
			return
		}
		checkFuzzedPaths(t, q)
	})
}

// fuzzBatchBody decodes the files of a batch body as the receiver does:
// whatever it accepts must be as safe as a single put.
func fuzzBatchBody(t *testing.T, req *http.Request, q request) {
	if q.count < 1 || q.count > batchMaxFiles {
		t.Fatalf("accepted batch of %d files", q.count)
	}
	br := bufio.NewReaderSize(io.LimitReader(req.Body, batchMaxBody), batchMaxHeader)
	for range q.count {
		fq, ferr, err := readBatchHeader(br, q)
		if err != nil {
			return
		}
		if fq.size < 0 || fq.size > batchMaxBody {
			t.Fatalf("accepted size %d", fq.size)
		}
		if ferr == nil {
			if fq.op != opPut || fq.epoch != q.epoch || fq.to != "" || fq.path == "" {
				t.Fatalf("batch file decoded to %+v", fq)
			}
			checkFuzzedPaths(t, fq)
		}
		if n, _ := io.CopyN(io.Discard, br, fq.size); n != fq.size {
			return
		}
	}
}

func checkFuzzedPaths(t *testing.T, q request) {
	for _, p := range []string{q.path, q.to} {
		if p == "" && q.op == opRename {
			t.Fatalf("rename without target: %+v", q)
		}
		if p == "" {
			continue
		}
		if !filepath.IsLocal(p) || strings.Contains(p, "\x00") || filepath.Clean(p) != p || reserved(p) {
			t.Fatalf("accepted unsafe path %q", p)
		}
	}
}

// The shipped example is a valid `sync:` section (strict keys).
func TestExampleConfig(t *testing.T) {
	b, err := os.ReadFile("../examples/syncdir.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := struct {
		Sync Config `yaml:"sync"`
	}{Sync: DefaultConfig()}
	if err := config.Decode(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Sync.Roots) != 2 || doc.Sync.Peer != "b.example:7402" || doc.Sync.Debounce != 2*time.Millisecond ||
		doc.Sync.ModeMask != 0o777 || doc.Sync.ManifestMaxBytes != 256<<20 {
		t.Fatalf("example decoded to %+v", doc.Sync)
	}
	doc.Sync.TLS = config.TLS{}
	doc.Sync.Insecure = true
	if err := doc.Sync.Validate(); err != nil {
		t.Fatalf("example (without its cert files): %v", err)
	}
}

// The record survives a round trip through its file format, odd names too.
func TestRecordEncoding(t *testing.T) {
	m := map[string]entry{
		"a/b.txt":           {Kind: 'f', Size: 12, Mtime: 1700000000123456789, Mode: 0o4755, Ino: 42},
		"dir":               {Kind: 'd', Mode: 0o755},
		"owned":             {Kind: 'f', Size: 1, Ctime: 9, Uid: 33, Gid: 4321, OwnerKnown: true},
		"root-owned":        {Kind: 'l', OwnerKnown: true},
		"sp ace\nnl\"q\x01": {Kind: 'l', Size: 3, Mtime: -5},
	}
	got, err := decodeRecord(encodeRecord(m))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(m) {
		t.Fatalf("got %v", got)
	}
	for k, v := range m {
		if got[k] != v {
			t.Fatalf("%q: %+v != %+v", k, got[k], v)
		}
	}
	if _, err := decodeRecord([]byte("garbage\n")); err == nil {
		t.Fatal("garbage accepted")
	}
}

// With a shared token instead of client certificates, a request without the
// token (or with a wrong one) is refused and counted.
func TestTokenAuth(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte("s3cret-token-0123456789\n"), 0o600)
	cfg := testConfig(p, "b", filepath.Join(dir, "root"), filepath.Join(dir, "state"), "127.0.0.1:1")
	cfg.TLS.CAFile = ""
	cfg.TokenFile = tok
	ln := listen(t)
	b := startNode(t, "b", cfg, ln, &fakeFence{})
	h := newHostileClient(t, p, ln.Addr().String())
	h.tls.Certificates = nil
	h.c.Transport = &http.Transport{TLSClientConfig: h.tls, ForceAttemptHTTP2: true}
	for _, auth := range []string{"", "Bearer wrong-token-0123456789", "s3cret-token-0123456789"} {
		req, _ := http.NewRequest("PUT", "https://"+h.addr+"/v1/put/data?path=t.txt&mode=644&mtime=0", strings.NewReader("x"))
		req.Header.Set(hdrEpoch, "1")
		req.Header.Set(hdrNode, "x")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := h.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("auth %q: %d", auth, resp.StatusCode)
		}
	}
	if got := b.s.Status().Rejected["auth"]; got != 3 {
		t.Fatalf("rejected[auth] = %d", got)
	}
	req, _ := http.NewRequest("PUT", "https://"+h.addr+"/v1/put/data?path=t.txt&mode=644&mtime=0", strings.NewReader("x"))
	req.Header.Set(hdrEpoch, "1")
	req.Header.Set(hdrNode, "x")
	req.Header.Set("Authorization", "Bearer s3cret-token-0123456789")
	resp, err := h.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || readFile(filepath.Join(b.root, "t.txt")) != "x" {
		t.Fatalf("with the token: %d", resp.StatusCode)
	}
}

// A directory whose permission bits are already the sent mode is not
// chmod'ed at all, and keeps the setgid bit it has here: a receiver that
// is not root does not own the application's directories, and chmod(2) by
// anyone else fails (the deployment on systemd hosts: "chmod w: operation
// not permitted" after a switchover). A mode that differs is applied
// (without setgid: the roled unit's RestrictSUIDSGID refuses setting it).
func TestMkdirKeepsSetgidAndOwnersMode(t *testing.T) {
	_, b, p := pair(t)
	h := newHostileClient(t, p, b.ln.Addr().String())
	if err := os.Chmod(b.root, 0o775|fs.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"app", "plain"} {
		if err := os.Mkdir(filepath.Join(b.root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(b.root, "app"), 0o775|fs.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(b.root, "plain"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctime := func(d string) unix.Timespec {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(b.root, d), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ctim
	}
	before := ctime("app")
	for _, c := range []struct {
		path, mode string
		want       fs.FileMode
	}{
		{"new", "775", 0o775}, // made 0700 (setgid inherited), then chmod'ed
		{"app", "775", 0o775 | fs.ModeSetgid},
		{"plain", "750", 0o750},
	} {
		if st := h.do("POST", "/v1/mkdir/data?path="+c.path+"&mode="+c.mode, "10", ""); st != 200 {
			t.Fatalf("mkdir %s: %d", c.path, st)
		}
		fi, err := os.Stat(filepath.Join(b.root, c.path))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (fs.ModePerm | fs.ModeSetgid); got != c.want {
			t.Errorf("%s: mode %v, want %v", c.path, got, c.want)
		}
	}
	if after := ctime("app"); after != before {
		t.Errorf("app: chmod'ed although already in the sent mode (ctime %v -> %v)", before, after)
	}
}
