package protocol

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A transfer_done with row sums is vLLM's four keys, byte for byte, then
// the peerkv map: a stock consumer never gets one (the capability gates
// it), and one without sums is the golden vector unchanged.
func TestTransferDoneCarriesRowSums(t *testing.T) {
	m := &TransferDone{KVRequestID: "r1", Success: true, RoundSeq: 0, RowSums: []uint64{0x0102030405060708, 0xa0b0c0d0e0f00010}}
	got, err := Encode(m)
	require.NoError(t, err)
	stock := "\xa4type\xadtransfer_done\xadkv_request_id\xa2r1\xa7success\xc3\xa9round_seq\x00"
	want := "\x85" + stock + "\xa6peerkv\x81\xa4xxh3\xc4\x10\x01\x02\x03\x04\x05\x06\x07\x08\xa0\xb0\xc0\xd0\xe0\xf0\x00\x10"
	assert.Equal(t, want, string(got))

	back, err := Decode(got, Limits{})
	require.NoError(t, err)
	assert.Equal(t, m, back)

	m.RowSums = nil
	plain, err := Encode(m)
	require.NoError(t, err)
	assert.Equal(t, "\x84"+stock, string(plain))
}

func TestTransferDoneRowSumsDecode(t *testing.T) {
	stock := "\xa4type\xadtransfer_done\xadkv_request_id\xa2r1\xa7success\xc3\xa9round_seq\x00"
	cases := map[string]struct {
		peerkv string
		sums   []uint64
		err    string
	}{
		"empty list": {"\x81\xa4xxh3\xc4\x00", []uint64{}, ""},
		// an older release's CRC-32C sums are not ours: ignored, so the
		// load fails for missing sums should they come anyway
		"other keys":    {"\x81\xa6crc32c\xc4\x04\x00\x00\x00\x01", nil, ""},
		"not 8 per row": {"\x81\xa4xxh3\xc4\x04\x00\x00\x00\x01", nil, "transfer_done: peerkv.xxh3: 4 bytes"},
		"str not bin":   {"\x81\xa4xxh3\xa8abcdefgh", nil, "peerkv.xxh3: expected bin"},
		"not a map":     {"\x01", nil, "transfer_done: peerkv: expected map"},
		"duplicate": {"\x82\xa4xxh3\xc4\x08\x00\x00\x00\x00\x00\x00\x00\x01\xa4xxh3\xc4\x08\x00\x00\x00\x00\x00\x00\x00\x01",
			nil, "peerkv.xxh3: duplicate key"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m, err := Decode([]byte("\x85"+stock+"\xa6peerkv"+c.peerkv), Limits{})
			if c.err != "" {
				require.ErrorIs(t, err, ErrMalformed)
				assert.Contains(t, err.Error(), c.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.sums, m.(*TransferDone).RowSums)
		})
	}
	_, err := Decode([]byte("\x85"+stock+"\xa6peerkv\x81\xa4xxh3\xc4\x18"+strings.Repeat("\x00", 24)), Limits{MaxListItems: 2})
	require.ErrorIs(t, err, ErrMalformed, "more sums than rows a list may hold")
}

// The verify capability travels in connect's peerkv map, after the fields
// peerkv sent before it, and only when offered.
func TestConnectOffersVerify(t *testing.T) {
	c := &Connect{PeerID: "127.0.0.1:5710", AgentMetadata: []byte{}, NumBlocks: 4, BlockLen: 16, HashSeed: "0",
		PeerKV: &Capabilities{Version: 2, Nonce: []byte{}, Verify: VerifyXXH3}}
	got, err := Encode(c)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(got), "\xa5nonce\xc4\x00\xa6verify\xa4xxh3"), "got %q", got)
	back, err := Decode(got, Limits{})
	require.NoError(t, err)
	assert.Equal(t, c, back)

	c.PeerKV.Verify = ""
	got, err = Encode(c)
	require.NoError(t, err)
	assert.NotContains(t, string(got), "verify")
}
