package roled

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// maxPatroniBody bounds what is read from Patroni: its status document is
// under 2 KiB; anything much larger is not Patroni.
const maxPatroniBody = 256 << 10

// errGarbage marks an answer that is not a Patroni status document.
var errGarbage = errors.New("patroni: not a status document")

// PatroniStatus is the part of Patroni's status document (GET /patroni, and
// the body of every status endpoint) that roled uses.
type PatroniStatus struct {
	State    string `json:"state"`
	Role     string `json:"role"` // "master" (3.0.x) or "primary" (newer), "replica", ...
	Timeline int64  `json:"timeline"`
	Xlog     struct {
		Location         int64 `json:"location"`          // primary
		ReceivedLocation int64 `json:"received_location"` // replica
		ReplayedLocation int64 `json:"replayed_location"` // replica
		Paused           bool  `json:"paused"`
	} `json:"xlog"`
	Patroni struct {
		Version string `json:"version"`
		Scope   string `json:"scope"`
	} `json:"patroni"`
	Pause bool `json:"pause"`
	// Tags are the member's effective tags (nofailover, ...).
	Tags           map[string]any `json:"tags"`
	PendingRestart bool           `json:"pending_restart"`
}

// patroniClient talks to the local Patroni REST API. Every call has its own
// timeout, reads a bounded body and never follows redirects.
type patroniClient struct {
	base    string
	timeout time.Duration
	hc      *http.Client
}

// tc is the TLS client side for an https base (nil: Go's defaults).
func newPatroniClient(base string, timeout time.Duration, tc *tls.Config) *patroniClient {
	tr := &http.Transport{
		// Patroni answers HTTP/1.0 and closes; keep-alives would only add
		// stale-connection errors.
		DisableKeepAlives:      true,
		TLSClientConfig:        tc,
		TLSHandshakeTimeout:    timeout,
		DialContext:            (&net.Dialer{Timeout: timeout}).DialContext,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: 16 << 10,
	}
	return &patroniClient{
		base:    strings.TrimSuffix(base, "/"),
		timeout: timeout,
		hc: &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// get performs one GET (or HEAD) and returns the status code and the body.
func (c *patroniClient) get(ctx context.Context, method, path string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("patroni request %s: %w", path, err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("patroni %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPatroniBody+1))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("patroni %s body: %w", path, err)
	}
	if len(body) > maxPatroniBody {
		return resp.StatusCode, nil, fmt.Errorf("patroni %s body over %d bytes: %w", path, maxPatroniBody, errGarbage)
	}
	return resp.StatusCode, body, nil
}

// Primary asks GET /primary. Its code says whether Patroni holds the leader
// lock, and its body is the same status document as /patroni, so one round
// trip gives both. Codes other than 200 and 503 and bodies that are not a
// status document are errGarbage.
func (c *patroniClient) Primary(ctx context.Context) (int, PatroniStatus, error) {
	return c.status(ctx, "/primary")
}

// Status asks GET /patroni.
func (c *patroniClient) Status(ctx context.Context) (PatroniStatus, error) {
	_, st, err := c.status(ctx, "/patroni")
	return st, err
}

// Replica asks GET /replica or /replica?lag=<maxLag> and returns the code:
// 200 means a running replica (within the lag bound, if one was given).
func (c *patroniClient) Replica(ctx context.Context, maxLag ByteSize) (int, error) {
	path := "/replica"
	if maxLag > 0 {
		path += fmt.Sprintf("?lag=%d", int64(maxLag))
	}
	code, _, err := c.get(ctx, http.MethodGet, path)
	return code, err
}

func (c *patroniClient) status(ctx context.Context, path string) (int, PatroniStatus, error) {
	var st PatroniStatus
	code, body, err := c.get(ctx, http.MethodGet, path)
	if err != nil {
		return code, st, err
	}
	if code != http.StatusOK && code != http.StatusServiceUnavailable {
		return code, st, fmt.Errorf("patroni %s: status %d: %w", path, code, errGarbage)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return code, st, fmt.Errorf("patroni %s: %v: %w", path, err, errGarbage)
	}
	if st.Role == "" || st.State == "" {
		return code, st, fmt.Errorf("patroni %s: no role or state: %w", path, errGarbage)
	}
	return code, st, nil
}

// TTL reads Patroni's ttl from GET /config (dynamic configuration).
func (c *patroniClient) TTL(ctx context.Context) (time.Duration, error) {
	code, body, err := c.get(ctx, http.MethodGet, "/config")
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("patroni /config: status %d", code)
	}
	return parsePatroniTTL(body)
}

// parsePatroniTTL reads "ttl" from Patroni's dynamic configuration JSON
// (the /config answer, or the value of the <namespace>/<scope>/config key).
func parsePatroniTTL(body []byte) (time.Duration, error) {
	var cfg struct {
		TTL json.Number `json:"ttl"`
	}
	if err := json.Unmarshal(body, &cfg); err != nil {
		return 0, fmt.Errorf("patroni config: %w", err)
	}
	if cfg.TTL == "" {
		return 0, errors.New("patroni config has no ttl")
	}
	f, err := cfg.TTL.Float64()
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("patroni config ttl %q: not a positive number", cfg.TTL)
	}
	return time.Duration(f * float64(time.Second)), nil
}
