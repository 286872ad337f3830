package ctl

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CertHost is one host to issue a certificate for: its name (the file name
// and CN) and its SANs (IP addresses or DNS names).
type CertHost struct {
	Name string
	SANs []string
}

// ParseCertHost reads "name=san1,san2" (the name itself is always a SAN).
func ParseCertHost(s string) (CertHost, error) {
	name, sans, _ := strings.Cut(s, "=")
	if name == "" || strings.ContainsAny(name, "/ ") {
		return CertHost{}, fmt.Errorf("host %q: want name=ip-or-dns[,ip-or-dns]", s)
	}
	h := CertHost{Name: name, SANs: []string{name}}
	for _, san := range strings.Split(sans, ",") {
		if san = strings.TrimSpace(san); san != "" {
			h.SANs = append(h.SANs, san)
		}
	}
	return h, nil
}

// Certs creates (or reuses) a CA in dir and issues, per host, a certificate
// usable as server and client (etcd peers and clients, roled's sync
// receiver and its sender, the balancer's checks): <name>.pem and
// <name>-key.pem. Existing host files are kept unless overwrite is set.
func Certs(dir string, hosts []CertHost, validity time.Duration, overwrite bool) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ca, caKey, err := loadOrCreateCA(dir, validity)
	if err != nil {
		return nil, err
	}
	var written []string
	for _, h := range hosts {
		cert := filepath.Join(dir, h.Name+".pem")
		if _, err := os.Stat(cert); err == nil && !overwrite {
			continue
		}
		if err := issue(dir, h, ca, caKey, validity); err != nil {
			return written, fmt.Errorf("host %s: %w", h.Name, err)
		}
		written = append(written, cert)
	}
	return written, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

func loadOrCreateCA(dir string, validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if cb, err := os.ReadFile(certPath); err == nil {
		kb, err := os.ReadFile(keyPath)
		if err != nil {
			return nil, nil, fmt.Errorf("ca.pem exists but its key does not: %w", err)
		}
		return parsePair(cb, kb)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "hapair CA", Organization: []string{"hapair"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	if err := writePair(certPath, keyPath, der, key); err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

func parsePair(cb, kb []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cp, _ := pem.Decode(cb)
	kp, _ := pem.Decode(kb)
	if cp == nil || kp == nil {
		return nil, nil, errors.New("ca.pem / ca-key.pem: not PEM")
	}
	ca, err := x509.ParseCertificate(cp.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(kp.Bytes)
	return ca, key, err
}

func issue(dir string, h CertHost, ca *x509.Certificate, caKey *ecdsa.PrivateKey, validity time.Duration) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: h.Name, Organization: []string{"hapair"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, san := range h.SANs {
		if ip := net.ParseIP(san); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, san)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePair(filepath.Join(dir, h.Name+".pem"), filepath.Join(dir, h.Name+"-key.pem"), der, key)
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}
