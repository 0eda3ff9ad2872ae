// Package tcpdata is the pure-Go data path: the producer pushes whole rows
// of its region over TCP into the consumer's region, mirroring the NIXL
// one-sided WRITE (vllm-tier-protocol.md §17). The producer learns of
// completion from the receiver's ack; the consumer learns of it only from
// the control path's transfer_done.
//
// # Roles and connections
//
// Every transport listens on a data port (DataAddr). To write to a peer the
// producer dials the peer's advertised DataAddr, opening up to Streams
// connections per peer; they stay open and are reused, and are closed by the
// producer after IdleTimeout without work (the receiver drops connections
// idle for twice as long, so it never closes one the producer is about to
// use). Writes queue per peer, in order; each connection takes the next
// part (consecutive rows) from the transfer at the front, carries one part
// at a time and waits for its ack. A part is sized to last about 50 ms on
// its connection at the speed the connection last showed (256 KiB at
// first, at most 64 MiB, at least one row, no tail under 256 KiB left
// over), and the kernel holds at most 256 KiB of a connection's bytes
// unsent (TCP_NOTSENT_LOWAT, Linux).
//
// Write returns at once; each transfer's outcome arrives exactly once on
// Completions, which is closed when Close returns. Cancel drops a
// transfer's rows not yet handed to a connection; a part of it on the wire
// ends at the end of the segment being written (about 5 ms of the
// connection's rate, 64 KiB to 4 MiB) with a cancel marker, and the
// transfer is reported failed with data.ErrCanceled once the receiver has
// acked that part. The receiver acks only after it read every byte before
// the marker, so nothing of a canceled transfer can land after its report,
// and the connection stays in step. (A reset would stop the bytes sooner,
// but what the receiver's socket already held could still be read after
// the report: the consumer, told the load ended, may have given those rows
// to a new load from the same peer, whose guard lets them in.) A receiver
// that offers no segments gets plain parts, which run to their end.
//
// # Wire format (little-endian, version 1: plaintext)
//
// Connection setup, receiver first:
//
//	server hello   magic "PKVD" u32 | version u8 | auth_required u8 | features u8 | pad u8 | nonce [32]
//	client hello   magic "PKVD" u32 | version u8 | pad u8 | id_len u16 | row_len u64 | mac [32] | id [id_len]
//	hello status   status u8 | pad u8 | msg_len u16 | msg [msg_len]
//
// id is the producer's peer id, the name the receiver's WriteGuard is asked
// about. mac must equal HMAC-SHA256(key, "peerkv/tcpdata/v1" | nonce |
// row_len u64 | id), where key is the data token the receiver granted id's
// current session (Grant; with an AuthSecret, secret | 0x00 |
// "peerkv-data-token" | 0x00 | token), or the AuthSecret alone when the
// receiver granted id nothing. With Options.RequireGrant a writer without a
// current grant is refused; without a key mac is ignored (the producer
// sends zeros). Revoking a grant cuts the connections it opened.
// row_len must equal the receiver's row length. A non-zero status comes
// with a reason and the receiver closes the connection. features bit 0
// (featureSegments) says the receiver reads segmented parts; receivers
// before it sent 0 there (padding), and producers before it ignore it, so
// either side may be older: the producer then sends plain parts.
//
// Per part, producer to receiver, then the receiver's ack:
//
//	part header    magic "PKVP" u32 | part_rows u32 | transfer_id u64 | row_len u64 | total_rows u32 | first u32
//	row indices    dst_row u64 × total_rows: the whole transfer's destinations
//	row bytes      row_len bytes × part_rows, for dst_row[first : first+part_rows]
//	ack            transfer_id u64 | status u8 | pad [7] | row u64
//
// A segmented part (to a receiver offering featureSegments) has magic
// "PKVS" and the same header and row indices; its row bytes come as
// segments:
//
//	segment        len u32 | len bytes of the part's row bytes, in order
//	cancel marker  len u32 = 0: nothing more of the part follows
//
// Segments may split a row; their lengths add up to the part's row bytes,
// unless a cancel marker ends the part early. A segment longer than what
// is left of the part, or shorter than 64 KiB without ending the part, is a
// protocol error. At a cancel marker the receiver
// drops a row it has not read whole (a guarded row is copied in only
// whole) and acks status 9 (canceled) with the row it was reading.
//
// Every part names all of its transfer's destination rows, and the receiver
// checks each (row < NumRows, Guard(id, row)) before it writes anything, so
// a refused transfer writes no row on any connection (unless the guard
// changes its mind between parts). Then it reads each row of the part
// straight into its destination slice. If a row fails the check it discards
// the part's row bytes, so the stream stays in step, and acks with the
// status and the offending row. The ack is sent only after the last byte of
// the part is in memory. A malformed header (bad magic, row_len, counts) is
// answered with statusBadRequest when possible and the connection closed.
//
// What a header makes the receiver hold follows what the writer is owed,
// not the region: when the guard can say how many rows the writer's loads
// expect (data.OwedRows), a part naming more is refused (status 7, row =
// the rows owed) before anything is allocated for it. Destination rows are
// read in small chunks; the receiver keeps only the part's (8 bytes a row)
// and, with a guard, one staged row, for as long as the part lasts, taken
// from a budget shared by all connections (MaxHeldBytes). A part that finds
// no room within half an IOTimeout is refused as busy (status 8). A refused
// part is read to its end and dropped, so the connection stays usable.
//
// # Admission
//
// Connections still in their hello have a budget of their own
// (MaxHelloConns, MaxHelloConnsPerHost from one source IP) and HelloTimeout
// to finish. A new connection beyond either bound is let in and closes one
// still in its hello (from its IP, else from the IP holding the most) that
// the receiver has begun to serve, the furthest from finishing a hello as a
// writer does: a writer sends each message of its hello whole and answers
// the receiver's at once. First the oldest whose first bytes do not start a
// hello (a stray byte, or not the plaintext client hello's magic and
// version, or, encrypted, a TLS record header and the ClientHello type);
// else one stopped mid-message (part of the client hello, or of a TLS
// record, never the rest); else one that has sent no byte the receiver
// read (the one it has waited longest to read from, then one whose first
// bytes wait unread in the socket). Last, one that sent each message
// whole: a writer waiting on its own round trip (mid TLS handshake, say),
// or whose bytes the receiver is working on; it is never closed while a
// connection from its IP has not been served yet. Among those, the one the
// receiver has waited longest to read from (bytes read below TLS; one
// whose bytes wait unread owes nothing), else the one that sent the fewest
// bytes. So strangers that never send, send stray bytes or send the start
// of a real hello and stop, even from a writer's own IP and redialled as
// soon as they are closed, give way before a writer, however long its
// round trip. The accept loop takes the next connection once the last
// one's hello has started (at most 20 ms later); a newcomer is closed at
// once (HelloRefused) when none it could replace was served yet, or it
// could replace only a connection that sent each message whole while one
// was not served yet.
// A writer can still be closed by strangers from its IP that each send a
// whole ClientHello and have waited less than it; the producer dials again
// when the receiver closes a connection without answering its hello (at
// most 8 dials, within one IOTimeout). Only a writer whose hello passed (proving its session's
// token, and the secret, when required) counts against MaxConns,
// MaxConnsPerHost and 4 × Streams connections per writer (peer id). A hello
// beyond any of them closes the connection (of that writer, that IP, else
// at all) that has gone longest without receiving rows its writer was owed,
// if longer than 1 s and not receiving a part now; else it is refused as
// busy. Only parts whose rows are accepted keep a connection: parts refused
// as not owed do not renew its idle deadline (2 × IdleTimeout + IOTimeout
// after the last useful part), and a writer owed no row that keeps sending
// parts is cut one IOTimeout after the first was refused. So a stranger
// that holds a token but is owed nothing cannot keep the places a writer
// with rows owed needs. Each cause is counted (InboundStats) and logged at
// most once per 10 s.
//
// # Encrypted mode (version 2)
//
// With Options.Encrypt (which requires AuthSecret) every connection runs
// under TLS 1.3, and version 1 is refused both ways. The receiver first
// sends, in the clear, a server hello of version 2 with auth_required 1 and
// a zero nonce: it only announces TLS (40 bytes, so a version-1 producer
// reads it whole and refuses the version). Then the producer, as the TLS
// client, runs the TLS 1.3 handshake. The receiver's certificate is
// self-signed, made at New and never verified: the hello below, bound to
// the TLS channel, authenticates both ends. Inside TLS the hello runs as
// in version 1, with version 2 and these changes:
//
//	server hello   as in version 1, with a fresh nonce
//	client hello   magic "PKVD" u32 | version u8 | pad u8 | id_len u16 | row_len u64 | mac [32] | client_nonce [32] | id [id_len]
//	hello status   status u8 | pad u8 | msg_len u16 | server_mac [32] | msg [msg_len]
//
// With exporter = the TLS exporter "EXPORTER-peerkv-tcpdata-v2" (no
// context, 32 bytes) of the connection:
//
//	mac        = HMAC-SHA256(secret, "peerkv/tcpdata/v2/client" | nonce | client_nonce | row_len u64 | exporter | id)
//	server_mac = HMAC-SHA256(secret, "peerkv/tcpdata/v2/server" | client_nonce | nonce | exporter | id)
//
// server_mac is sent only with status ok (zeros otherwise), after mac
// checked out, and the producer sends no part until it checks server_mac.
// A man in the middle that terminates TLS toward each side holds two
// exporters, so neither MAC it relays verifies. Parts and acks then flow
// inside TLS as in version 1.
//
// A producer whose receiver announces the other version sends the fixed
// part of a client hello with its own version (zeros elsewhere) and closes,
// so the receiver can log the mismatch too; both sides' errors say "set
// encrypt on every peer".
//
// Status codes: 0 ok, 1 rejected by the guard, 2 row out of range,
// 3 bad request, 4 authentication failed, 5 row length mismatch,
// 6 unsupported version, 7 more rows than the writer is owed, 8 busy,
// 9 canceled (the part ended at a cancel marker).
//
// # Deadlines
//
// The hello, the TLS handshake included, must finish within IOTimeout on
// the producer and HelloTimeout on the receiver.
// Every read and write has a deadline of IOTimeout, renewed as bytes make
// progress (per row on the receiver, per batch of rows on the producer); the
// ack must arrive within IOTimeout of the part's last byte. A connection
// that misses a deadline is closed and its part fails; the next part dials
// again.
package tcpdata
