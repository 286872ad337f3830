// Package testpki is a throw-away certificate authority for tests: a CA,
// one certificate for 127.0.0.1 and localhost usable as server and client,
// and one signed by another CA, as PEM files in a test's temporary
// directory. Tests only; production certificates come from hapairctl certs.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hapair/hapair/internal/config"
)

// PKI is one test's CA and certificates (paths of PEM files).
type PKI struct {
	Dir                 string
	CA, Cert, Key       string
	CACert              *x509.Certificate
	CAKey               *ecdsa.PrivateKey
	OtherCert, OtherKey string // a certificate for the same names, signed by another CA
}

// New makes the CA and both certificates under t.TempDir().
func New(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{Dir: t.TempDir()}
	p.CACert, p.CAKey = makeCA(t, "hapair-test-ca")
	p.CA = p.writePEM(t, "ca.pem", "CERTIFICATE", p.CACert.Raw)
	p.Cert, p.Key = p.issue(t, "node", p.CACert, p.CAKey)
	rc, rk := makeCA(t, "rogue-ca")
	p.OtherCert, p.OtherKey = p.issue(t, "rogue", rc, rk)
	return p
}

// TLS is the node certificate with the CA, as one config section.
func (p *PKI) TLS() config.TLS {
	return config.TLS{CertFile: p.Cert, KeyFile: p.Key, CAFile: p.CA}
}

func makeCA(t testing.TB, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, k
}

func (p *PKI) issue(t testing.TB, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (string, string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &k.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(k)
	return p.writePEM(t, name+".pem", "CERTIFICATE", der), p.writePEM(t, name+"-key.pem", "EC PRIVATE KEY", kb)
}

func (p *PKI) writePEM(t testing.TB, name, typ string, der []byte) string {
	f := filepath.Join(p.Dir, name)
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// Server is an HTTPS test server of Serve.
type Server struct {
	URL         string // "https://127.0.0.1:port"
	clientCerts atomic.Int32
}

// ClientCerts is how many requests came with a client certificate.
func (s *Server) ClientCerts() int { return int(s.clientCerts.Load()) }

// Serve starts an HTTPS server on 127.0.0.1 with the node certificate that
// asks for a client certificate of the CA without requiring one, as
// Patroni's REST API does with restapi verify_client: optional. The server
// stops at cleanup. Refused handshakes are not logged (tests provoke them).
func (p *PKI) Serve(t testing.TB, h http.Handler) *Server {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(p.Cert, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.CACert)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{URL: "https://" + ln.Addr().String()}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if len(r.TLS.PeerCertificates) > 0 {
				s.clientCerts.Add(1)
			}
			h.ServeHTTP(w, r)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven},
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return s
}
