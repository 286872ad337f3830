package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLS names the PEM files of one TLS endpoint. With CAFile set, a server
// requires and verifies client certificates signed by that CA, and a client
// verifies the server against it.
type TLS struct {
	// CertFile is this endpoint's certificate (PEM).
	CertFile string `yaml:"cert-file"`
	// KeyFile is the private key of CertFile (PEM).
	KeyFile string `yaml:"key-file"`
	// CAFile is the CA bundle that signs the peers (PEM).
	CAFile string `yaml:"ca-file"`
	// ServerName overrides the name a client verifies (default: the dialled host).
	ServerName string `yaml:"server-name"`
}

// Enabled reports whether any TLS file is configured.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.CAFile != "" }

// Validate checks that the files exist, parse, and that the key matches the
// certificate. field is the section's path, e.g. "peer-tls".
func (t TLS) Validate(field string) error {
	if !t.Enabled() {
		return nil
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return Errorf(Join(field, "cert-file"), t.CertFile, "cert-file and key-file must be set together")
	}
	if t.CertFile != "" {
		for _, f := range []struct{ name, path string }{{"cert-file", t.CertFile}, {"key-file", t.KeyFile}} {
			if _, err := os.ReadFile(f.path); err != nil {
				return Errorf(Join(field, f.name), f.path, "cannot read: %v", unwrapPath(err))
			}
		}
		if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			return Errorf(Join(field, "cert-file"), t.CertFile, "bad certificate or key: %v", err)
		}
	}
	if t.CAFile != "" {
		if _, err := t.pool(); err != nil {
			return Errorf(Join(field, "ca-file"), t.CAFile, "%v", err)
		}
	}
	return nil
}

func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

func (t TLS) pool() (*x509.CertPool, error) {
	b, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, fmt.Errorf("cannot read: %w", unwrapPath(err))
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("no PEM certificate found")
	}
	return p, nil
}

// ServerConfig returns the server side: its certificate, and client
// certificate verification when CAFile is set.
func (t TLS) ServerConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CertFile == "" {
		return nil, fmt.Errorf("tls: a server needs cert-file and key-file")
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	c.Certificates = []tls.Certificate{cert}
	if t.CAFile != "" {
		p, err := t.pool()
		if err != nil {
			return nil, fmt.Errorf("tls: ca-file: %w", err)
		}
		c.ClientCAs = p
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// ClientConfig returns the client side: its certificate when set, and the CA
// to verify the server with (the system pool when CAFile is empty).
func (t TLS) ClientConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if t.CAFile != "" {
		p, err := t.pool()
		if err != nil {
			return nil, fmt.Errorf("tls: ca-file: %w", err)
		}
		c.RootCAs = p
	}
	return c, nil
}
