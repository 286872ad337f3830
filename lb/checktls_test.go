package lb

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/internal/testpki"
)

// TestCheckOverTLS: a check with check.tls speaks HTTPS the way Patroni's
// REST API with restapi.certfile and verify_client optional expects it: the
// server is verified against ca-file, the client certificate is offered,
// and a server the CA did not sign, or a plain check against TLS, fails.
func TestCheckOverTLS(t *testing.T) {
	p := testpki.New(t)
	srv := p.Serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/primary" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"role":"primary"}`))
	}))
	addr := strings.TrimPrefix(srv.URL, "https://")

	check := func(c CheckConfig) checkResult {
		t.Helper()
		if err := c.validate("backends[0].check", KindPGPrimary); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return httpCheck(ctx, addr, c.Method, c.Path, c.MaxResponseBytes, c.tlsClient)
	}
	r := check(CheckConfig{TLS: p.TLS()})
	if r.err != nil || r.status != 200 {
		t.Fatalf("TLS check: %+v, want 200", r)
	}
	if srv.ClientCerts() != 1 {
		t.Errorf("client certificate presented %d times, want 1", srv.ClientCerts())
	}

	if r := check(CheckConfig{TLS: config.TLS{CAFile: p.OtherCert}}); r.err == nil || !strings.Contains(r.err.Error(), "tls:") {
		t.Errorf("check against a server another CA signed: %+v, want a tls error", r)
	}
	if r := check(CheckConfig{}); r.err == nil && r.status == 200 {
		t.Errorf("plain check against a TLS server answered 200")
	}
}

// TestCheckTLSConfigErrors: bad TLS files are config errors naming the field.
func TestCheckTLSConfigErrors(t *testing.T) {
	p := testpki.New(t)
	for _, tc := range []struct {
		tls  config.TLS
		want string
	}{
		{config.TLS{CAFile: "/nonexistent/ca.pem"}, "backends[0].check.tls.ca-file"},
		{config.TLS{CertFile: p.Cert}, "backends[0].check.tls.cert-file"},
		{config.TLS{CAFile: p.CA, CertFile: p.Cert, KeyFile: p.OtherKey}, "backends[0].check.tls.cert-file"},
	} {
		c := CheckConfig{TLS: tc.tls}
		err := c.validate("backends[0].check", KindPGPrimary)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.tls, err, tc.want)
		}
	}
}
