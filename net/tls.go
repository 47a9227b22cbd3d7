package net

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/messages"
)

// serverTLS picks the TLS configuration by the protocol the client asks
// for: lsync/1 admits pinned certificates only, lsync-pair/1 any device
// certificate (the PAKE authenticates). Each handshake gets its own, so
// its refusals can name the address they come from.
func (t *QUICTransport) serverTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{t.id.Certificate},
		NextProtos:   []string{alpnSync, alpnPair},
		GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			remote := "unknown"
			if hi.Conn != nil {
				remote = hi.Conn.RemoteAddr().String()
			}
			switch {
			case slices.Contains(hi.SupportedProtos, alpnSync):
				return t.tlsConfig(alpnSync, nil, remote), nil
			case slices.Contains(hi.SupportedProtos, alpnPair):
				return t.tlsConfig(alpnPair, nil, remote), nil
			}
			err := fmt.Errorf("unsupported application protocols %q", hi.SupportedProtos)
			t.refuseHandshake(remote, messages.ReasonWrongALPN, err)
			return nil, err
		},
	}
}

// tlsConfig is the TLS configuration of one protocol, for both roles:
// TLS 1.3, our certificate, the peer's certificate required. Chain
// validation is replaced by pinning (VerifyPeerCertificate), so
// InsecureSkipVerify only turns off the CA check, and a server only
// requests the client's certificate so that the verifier, not the TLS
// stack, refuses (and counts) a client without one. expect, when
// dialing, is the device we mean to reach; remote is the peer's address.
func (t *QUICTransport) tlsConfig(proto string, expect *messages.DeviceID, remote string) *tls.Config {
	check := func(raw [][]byte) (messages.Reason, error) { return t.checkPinned(raw, expect) }
	if proto == alpnPair {
		check = checkDeviceCert
	}
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		Certificates:           []tls.Certificate{t.id.Certificate},
		NextProtos:             []string{proto},
		ClientAuth:             tls.RequestClientCert,
		InsecureSkipVerify:     true,
		SessionTicketsDisabled: true,
		ServerName:             "lsync",
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			reason, err := check(raw)
			if err != nil {
				t.refuseHandshake(remote, reason, err)
				return &certRefusal{err}
			}
			return nil
		},
	}
}

// refuseHandshake counts and logs (rate-limited) a handshake refused for
// reason.
func (t *QUICTransport) refuseHandshake(remote string, reason messages.Reason, err error) {
	t.obs.Rejected(reason)
	t.warnRefusal(sourceOf(remote), reason, "refused a handshake", "addr", remote, "err", err)
}

// checkPinned admits a certificate only if it is pinned under the device id
// derived from its key, and (when dialing) that id is the one expected; a
// refusal comes with its reason.
func (t *QUICTransport) checkPinned(raw [][]byte, expect *messages.DeviceID) (messages.Reason, error) {
	if len(raw) == 0 {
		return messages.ReasonNoCertificate, fmt.Errorf("%w: no certificate", ErrNotPaired)
	}
	id, err := deviceIDFromCert(raw[0])
	if err != nil {
		return messages.ReasonUnpaired, fmt.Errorf("%w: %v", ErrNotPaired, err)
	}
	if expect != nil && id != *expect {
		return messages.ReasonWrongPeer, fmt.Errorf("%w: dialed %s, reached %s", ErrWrongPeer, *expect, id)
	}
	p, ok := t.peers.Get(id)
	if !ok {
		return messages.ReasonUnpaired, fmt.Errorf("%w: %s", ErrNotPaired, id)
	}
	if p.Fingerprint != fingerprintOf(raw[0]) {
		return messages.ReasonUnpaired, fmt.Errorf("%w: %s presented a certificate other than the pinned one", ErrNotPaired, id)
	}
	return "", nil
}

// certRefusal marks our verifier's refusal inside the TLS error quic-go
// returns, so Dial can report it without the TLS wrapping.
type certRefusal struct{ err error }

func (r *certRefusal) Error() string { return r.err.Error() }
func (r *certRefusal) Unwrap() error { return r.err }

// checkDeviceCert admits any lsync device certificate (Ed25519), for
// pairing.
func checkDeviceCert(raw [][]byte) (messages.Reason, error) {
	if len(raw) == 0 {
		return messages.ReasonNoCertificate, errors.New("no certificate")
	}
	if _, err := deviceIDFromCert(raw[0]); err != nil {
		return messages.ReasonPairingFailed, err
	}
	return "", nil
}

// peerID is the device id of the certificate the peer presented.
func peerID(qc *quic.Conn) (messages.DeviceID, error) {
	certs := qc.ConnectionState().TLS.PeerCertificates
	if len(certs) == 0 {
		return messages.DeviceID{}, errors.New("no peer certificate")
	}
	return deviceIDFromCert(certs[0].Raw)
}
