package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAllowedPeersRefusesBadEntriesNamingThem(t *testing.T) {
	for entry, want := range map[string]string{
		"10.0.0.0/33":         `allowed_peers[0] "10.0.0.0/33" is not a CIDR`,
		"fd00::/129":          `allowed_peers[0] "fd00::/129" is not a CIDR`,
		"10.0.0.0/x":          `is not a CIDR`,
		"10.1.2.3/8":          `allowed_peers[0] "10.1.2.3/8" has bits set past its /8: write "10.0.0.0/8"`,
		"fd00::1/8":           `has bits set past its /8: write "fd00::/8"`,
		"::ffff:10.0.0.0/104": `is an IPv4-mapped IPv6 prefix`,
		"10.0.0.300":          `is not a CIDR, an IP address or a host name`,
		"":                    `is not a CIDR, an IP address or a host name`,
		"prefill-0.svc:5710":  `is not a CIDR, an IP address or a host name`,
		"[::1]":               `is not a CIDR, an IP address or a host name`,
		"-bad.svc":            `is not a CIDR, an IP address or a host name`,
		"a..b":                `is not a CIDR, an IP address or a host name`,
		"fe80::1%eth0":        `has a zone`,
	} {
		cfg := Config{AllowedPeers: []string{entry}}.WithDefaults()
		err := cfg.Validate()
		if assert.Error(t, err, entry) {
			assert.Contains(t, err.Error(), want, entry)
		}
	}
}

func TestAllowedPeersMatchAddressesByPrefixAndNamesAsGiven(t *testing.T) {
	l, err := ParsePeerList([]string{"10.0.0.0/8", "fd00::/8", "192.168.1.7", "Prefill-0.SVC.", "*.decode.ns.svc"})
	require.NoError(t, err)
	dial := map[string]bool{
		"10.1.2.3:5710":               true,
		"[fd00::1]:5710":              true,
		"192.168.1.7:1":               true,
		"prefill-0.svc:5710":          true,
		"PREFILL-0.svc.:5710":         true,
		"d-3.decode.ns.svc:5710":      true,
		"11.0.0.1:5710":               false,
		"[fe80::1]:5710":              false,
		"192.168.1.8:1":               false,
		"prefill-1.svc:5710":          false,
		"decode.ns.svc:5710":          false, // the wildcard wants a label in front
		"evil.decode.ns.svc.io:5710":  false,
		"localhost:5710":              false, // a name is never resolved: 127.0.0.1 is not listed anyway
		"prefill-0.svc":               false, // no port: not an id
		"[::ffff:10.1.2.3]:5710":      true,  // the mapped IPv4 address is inside 10/8
		"[fd00::1%eth0]:5710":         true,  // the zone does not change the address
		"0xa.0.0.1:5710":              false, // not an address, and no name entry matches
		"10.0.0.1.nip.io:5710":        false, // a name resolving into 10/8 is still a name
		"[10.1.2.3]:5710":             true,
		"prefill-0.svc.attacker:5710": false,
	}
	for id, want := range dial {
		assert.Equal(t, want, l.AllowsPeerID(id), id)
	}
	// Connects: the source address against the address entries alone.
	for addr, want := range map[string]bool{
		"10.9.9.9": true, "fd12::5": true, "192.168.1.7": true, "192.168.1.8": false, "127.0.0.1": false, "": false,
	} {
		assert.Equal(t, want, l.AllowsAddr(addr), addr)
	}
	// Names alone would let us dial a peer whose answering connection we
	// then shut: refused.
	_, err = ParsePeerList([]string{"prefill-0.svc", "*.decode.svc"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "allowed_peers lists no address")
	var all PeerList
	assert.True(t, all.AllowsAll())
	assert.True(t, all.AllowsPeerID("anything:1"))
	assert.True(t, all.AllowsAddr(""))
}
