package roled

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/config"
	"github.com/hapair/hapair/internal/testpki"
)

// TestPatroniOverTLS: with patroni.tls roled reads Patroni's REST API over
// HTTPS (restapi.certfile, verify_client optional), verifying Patroni
// against the CA and offering its own certificate; a Patroni the CA did not
// sign is an error, never an answer.
func TestPatroniOverTLS(t *testing.T) {
	p := testpki.New(t)
	srv := p.Serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"state":"running","role":"master","timeline":2}`)
	}))
	url := srv.URL

	client := func(tc config.TLS) *patroniClient {
		c, err := tc.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		return newPatroniClient(url, 2*time.Second, c)
	}
	code, st, err := client(p.TLS()).Primary(context.Background())
	if err != nil || code != 200 || st.Role != "master" || st.Timeline != 2 {
		t.Fatalf("over TLS: %d %+v %v", code, st, err)
	}
	if srv.ClientCerts() != 1 {
		t.Errorf("client certificate offered %d times, want 1", srv.ClientCerts())
	}
	if _, _, err := client(config.TLS{CAFile: p.OtherCert}).Primary(context.Background()); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Errorf("Patroni signed by another CA: %v, want a certificate error", err)
	}
}

// TestPatroniTLSConfig: patroni.tls needs an https url, and its files are
// checked, each error naming the field.
func TestPatroniTLSConfig(t *testing.T) {
	p := testpki.New(t)
	for _, tc := range []struct {
		name  string
		url   string
		tls   config.TLS
		field string // "" for valid
	}{
		{"https with the CA and a client certificate", "https://10.0.0.11:8008", p.TLS(), ""},
		{"https with the system CAs", "https://10.0.0.11:8008", config.TLS{}, ""},
		{"tls on a plain url", "http://127.0.0.1:8008", p.TLS(), "patroni.tls"},
		{"missing CA", "https://10.0.0.11:8008", config.TLS{CAFile: "/nonexistent/ca.pem"}, "patroni.tls.ca-file"},
		{"certificate without its key", "https://10.0.0.11:8008", config.TLS{CertFile: p.Cert}, "patroni.tls.cert-file"},
		{"not a URL", "10.0.0.11:8008", config.TLS{}, "patroni.url"},
	} {
		c := DefaultConfig()
		c.Node = "A"
		c.Patroni.URL, c.Patroni.TLS = tc.url, tc.tls
		err := c.Validate()
		var fe *config.FieldError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field):
			t.Errorf("%s: error %v, want one naming %s", tc.name, err, tc.field)
		}
	}
}
