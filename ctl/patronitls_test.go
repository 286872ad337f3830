package ctl

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/internal/testpki"
)

// TestPatroniTLS: with patroni-tls hapairctl reads Patroni over HTTPS and
// presents its client certificate on POST /switchover, as Patroni's
// restapi verify_client: optional demands (its check_access: 403 "client
// certificate required" for unsafe methods without one). The same POST
// without a certificate is refused.
func TestPatroniTLS(t *testing.T) {
	p := testpki.New(t)
	srv := p.Serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "client certificate required", http.StatusForbidden)
			return
		}
		switch r.URL.Path {
		case "/cluster":
			_, _ = io.WriteString(w, `{"members":[{"name":"a","role":"leader","state":"running","timeline":1}]}`)
		case "/switchover":
			_, _ = io.WriteString(w, "Successfully switched over")
		default:
			http.NotFound(w, r)
		}
	}))
	url := srv.URL

	client := func(tc config.TLS) *Client {
		cfg := DefaultConfig()
		cfg.PatroniTLS = tc
		cfg.Nodes = []Node{{Name: "a", PatroniURL: url}, {Name: "b", PatroniURL: url}}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return NewClient(cfg, nil, nil)
	}
	c := client(p.TLS())
	if m := c.patroniCluster(context.Background()); len(m) != 1 || m[0].Name != "a" {
		t.Fatalf("GET /cluster over TLS: %+v", m)
	}
	if err := c.postSwitchover(context.Background(), c.Cfg.Nodes[0], c.Cfg.Nodes[1]); err != nil {
		t.Fatalf("POST /switchover with the client certificate: %v", err)
	}
	noCert := client(config.TLS{CAFile: p.CA})
	if err := noCert.postSwitchover(context.Background(), c.Cfg.Nodes[0], c.Cfg.Nodes[1]); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("POST /switchover without a client certificate: %v, want 403", err)
	}
	if m := client(config.TLS{}).patroniCluster(context.Background()); m != nil {
		t.Errorf("GET /cluster without the cluster's CA: %+v, want a verification failure", m)
	}
}
