package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hapair/hapair/internal/config"
)

// testCA is a throwaway certificate authority for one test.
type testCA struct {
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	caFile string
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{dir: t.TempDir(), cert: cert, key: key}
	ca.caFile = filepath.Join(ca.dir, "ca.pem")
	writePEM(t, ca.caFile, "CERTIFICATE", der)
	return ca
}

// issue writes a certificate for 127.0.0.1 usable as server and client (as
// etcd members need) and returns its TLS section.
func (ca *testCA) issue(t *testing.T, name string) config.TLS {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	out := config.TLS{
		CertFile: filepath.Join(ca.dir, name+".pem"),
		KeyFile:  filepath.Join(ca.dir, name+"-key.pem"),
		CAFile:   ca.caFile,
	}
	writePEM(t, out.CertFile, "CERTIFICATE", der)
	writePEM(t, out.KeyFile, "EC PRIVATE KEY", kb)
	return out
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func tlsSection(c config.TLS) map[string]string {
	return map[string]string{"cert-file": c.CertFile, "key-file": c.KeyFile, "ca-file": c.CAFile}
}

func tlsClient(t *testing.T, endpoints []string, tc *tls.Config) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, TLS: tc, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Must show 4: a cluster with mutual TLS on client and peer traffic works
// (the witness's TLS health probes see all members), and clients without a
// certificate, or with one from another CA, are refused.
func TestMutualTLS(t *testing.T) {
	ca := newTestCA(t, "hapair-test-ca")
	a := newProc(t, "nodeA", "member", "https")
	b := newProc(t, "nodeB", "member", "https")
	w := newProc(t, "witness", "witness", "https")
	bootstrap(a, b, w)
	for _, p := range []*proc{a, b, w} {
		sec := tlsSection(ca.issue(t, p.name))
		p.cfg["client-tls"], p.cfg["peer-tls"] = sec, sec
		p.start()
	}
	for _, p := range []*proc{a, b, w} {
		p.waitReady(readyTimeout)
	}

	good, err := ca.issue(t, "client").ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cli := tlsClient(t, clientURLs(a, b, w), good)
	putEventually(t, cli, "tls", "ok", 5*time.Second)
	mustGet(t, cli, "tls", "ok")
	waitFor(t, 5*time.Second, "the witness to see 3 healthy members over TLS", func() bool {
		return w.metric("hapair_witness_members_healthy") == 3
	})

	noCert, err := config.TLS{CAFile: ca.caFile}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	otherCA, err := newTestCA(t, "other-ca").issue(t, "intruder").ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	otherCA.RootCAs = good.RootCAs // trusts the server; the server must not trust it
	for name, tc := range map[string]*tls.Config{"no client certificate": noCert, "certificate from another CA": otherCA} {
		bad, err := clientv3.New(clientv3.Config{Endpoints: []string{a.clientURL}, TLS: tc, Logger: zap.NewNop()})
		if err != nil {
			continue // refused while dialling: fine
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = bad.Put(ctx, "tls", "intruder")
		cancel()
		bad.Close()
		if err == nil {
			t.Fatalf("%s: put succeeded, want refused", name)
		}
	}
	mustGet(t, cli, "tls", "ok")
}
