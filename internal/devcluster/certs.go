package devcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the set of keys and certificates of one local cluster: a CA, the
// API server's serving certificate, one client certificate per component
// (so the real RBAC bootstrap policy applies to each of them) and the
// service-account signing key.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

// keyPair is a certificate and its key, as PEM files on disk and in memory.
type keyPair struct {
	CertFile, KeyFile string
	CertPEM, KeyPEM   []byte
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating pki dir: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gpufleet-devcluster-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	p := &pki{dir: dir, caCert: cert, caKey: key}
	if _, err := p.write("ca", der, key); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pki) caFile() string    { return filepath.Join(p.dir, "ca.crt") }
func (p *pki) caKeyFile() string { return filepath.Join(p.dir, "ca.key") }
func (p *pki) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.caCert.Raw})
}

// serving issues a serving certificate for the loopback API server.
func (p *pki) serving(name string, dnsNames []string, ips []net.IP) (keyPair, error) {
	return p.issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		DNSNames:    dnsNames,
		IPAddresses: ips,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// client issues a client certificate; user is the CN, groups the O entries.
func (p *pki) client(file, user string, groups ...string) (keyPair, error) {
	return p.issue(file, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (p *pki) issue(name string, tmpl *x509.Certificate) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("generating key for %s: %w", name, err)
	}
	p.serial++
	tmpl.SerialNumber = big.NewInt(p.serial + 1)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return keyPair{}, fmt.Errorf("signing certificate for %s: %w", name, err)
	}
	return p.write(name, der, key)
}

func (p *pki) write(name string, der []byte, key *ecdsa.PrivateKey) (keyPair, error) {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return keyPair{}, fmt.Errorf("encoding key for %s: %w", name, err)
	}
	kp := keyPair{
		CertFile: filepath.Join(p.dir, name+".crt"),
		KeyFile:  filepath.Join(p.dir, name+".key"),
		CertPEM:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:   pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	if err := os.WriteFile(kp.CertFile, kp.CertPEM, 0o600); err != nil {
		return keyPair{}, fmt.Errorf("writing %s: %w", kp.CertFile, err)
	}
	if err := os.WriteFile(kp.KeyFile, kp.KeyPEM, 0o600); err != nil {
		return keyPair{}, fmt.Errorf("writing %s: %w", kp.KeyFile, err)
	}
	return kp, nil
}

// serviceAccountKey writes the key pair that signs service-account tokens.
func (p *pki) serviceAccountKey() (priv, pub string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generating service-account key: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", fmt.Errorf("encoding service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("encoding service-account public key: %w", err)
	}
	priv = filepath.Join(p.dir, "sa.key")
	pub = filepath.Join(p.dir, "sa.pub")
	if err := os.WriteFile(priv, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", fmt.Errorf("writing %s: %w", priv, err)
	}
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return "", "", fmt.Errorf("writing %s: %w", pub, err)
	}
	return priv, pub, nil
}
