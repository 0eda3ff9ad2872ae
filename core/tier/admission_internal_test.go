package tier

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestRefusalLinesGoOutOncePerIntervalCountingTheRest(t *testing.T) {
	var l everyLog
	t0 := time.Unix(1000, 0)
	ok, more := l.take(t0)
	assert.True(t, ok)
	assert.Zero(t, more)
	for i := range 3 {
		ok, _ = l.take(t0.Add(time.Duration(i+1) * time.Second))
		assert.False(t, ok, "inside the interval")
	}
	ok, more = l.take(t0.Add(refusalLogEvery))
	assert.True(t, ok, "the next interval")
	assert.Equal(t, 3, more, "it says how many lines it stands for")
	ok, more = l.take(t0.Add(3 * refusalLogEvery))
	assert.True(t, ok)
	assert.Zero(t, more)
}

func TestNetworksAreIPv4Slash24AndIPv6Slash64(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.1.2":             "127.0.1.0/24",
		"127.0.1.250":           "127.0.1.0/24",
		"::ffff:127.0.1.3":      "127.0.1.0/24",
		"fd00:1:2:3:4:5:6:7":    "fd00:1:2:3::/64",
		"fd00:1:2:3:ffff::1":    "fd00:1:2:3::/64",
		"fe80::1%eth0":          "fe80::/64",
		"":                      "",
		"not-an-address":        "not-an-address",
		"fd00:1:2:4:4:5:6:7":    "fd00:1:2:4::/64",
		"10.0.0.1":              "10.0.0.0/24",
		"10.0.1.1":              "10.0.1.0/24",
		"2001:db8::1":           "2001:db8::/64",
		"2001:db8:0:0:8000::1":  "2001:db8::/64",
		"2001:db8:0:1:8000::1":  "2001:db8:0:1::/64",
		"192.168.255.255":       "192.168.255.0/24",
		"0.0.0.0":               "0.0.0.0/24",
		"::":                    "::/64",
		"::1":                   "::/64",
		"2001:db8:ffff:ffff::1": "2001:db8:ffff:ffff::/64",
		"2001:0db8:0000::0001":  "2001:db8::/64",
	} {
		assert.Equal(t, want, networkOf(addr), addr)
	}
}
