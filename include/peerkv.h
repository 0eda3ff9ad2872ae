/*
 * peerkv.h — the C ABI of libpeerkv.so, a peer-to-peer KV-cache tier for vLLM.
 *
 * This header is the contract. Everything a host (vLLM's Python shim, the C
 * harness, any other embedder) may rely on is written here.
 *
 * Model
 *   A handle is one node (this side; a peer is always a remote node): it
 *   binds a ZMQ control socket at host:port, serves its primary CPU region
 *   (num_rows rows of row_len bytes, owned by the host) to remote consumers,
 *   and pulls rows from remote producers into it.
 *   Network progress runs on the library's own threads. No call below waits
 *   on the network except peerkv_drain and peerkv_destroy, and both are
 *   bounded by their configured deadlines.
 *
 * Conventions
 *   - Every function that can fail returns int32_t: PEERKV_OK (0) or a
 *     negative PEERKV_ERR_* code. When err is non-NULL and errlen > 0, a
 *     human-readable message is written there, always NUL-terminated
 *     (truncated to fit); on success err[0] is set to '\0'.
 *   - Strings are NUL-terminated UTF-8 unless a length is given.
 *   - Offload keys are passed as one buffer of n keys of key_len bytes each,
 *     concatenated. key_len must equal the "key_len" option when that is set.
 *   - Memory: the library never keeps a pointer passed to a call, except the
 *     region passed to peerkv_create, which must stay mapped and valid until
 *     peerkv_destroy returns. All output buffers are caller-allocated. The
 *     library allocates nothing the caller must free.
 *   - Threads: calls on one handle may come from any thread but are
 *     serialised internally; they never block on network I/O.
 *   - The calls a scheduler makes every step never wait for the library's
 *     own threads either: when the state they read is busy for more than
 *     half a millisecond they return at once with no work done now, and the
 *     work follows a step later. peerkv_get_finished, peerkv_take_answers
 *     and peerkv_next_inbound then return nothing, and the matching news
 *     count moves again (the notification fd becomes readable) once the
 *     library is done, so the host calls again; peerkv_lookup answers
 *     RETRY for every key (ask again next step); peerkv_lookup_many too,
 *     and the library registers its keys itself (the answers of an ASK
 *     request come as changes);
 *     peerkv_on_schedule_end's sends happen on the library's thread;
 *     peerkv_answer_inbound, answering the EVALUATE handed out last, sets
 *     *finished to 0 and a FINISH for that lookup follows once the answer
 *     was applied (its pin job is reported as usual);
 *     peerkv_has_pending_work returns 1; peerkv_stats writes the last
 *     document it built, without "peers". Nothing is lost or reported
 *     twice. After a second of calls that all did without, the next
 *     peerkv_get_finished, peerkv_take_answers, peerkv_next_inbound or
 *     peerkv_lookup waits its turn, so nothing is left uncollected (or
 *     unregistered) for longer. The
 *     "host_calls_deferred" counter says how often it happened.
 *   - fork: after fork(), every call in the child returns PEERKV_ERR_FORKED.
 *     Load the library after the process split (e.g. in a spawned child).
 *   - Panics inside the library are recovered and returned as
 *     PEERKV_ERR_INTERNAL; the library is then poisoned and every later call
 *     fails with PEERKV_ERR_INTERNAL.
 */
#ifndef PEERKV_H
#define PEERKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version: major changes break callers; minor adds symbols. */
#define PEERKV_ABI_VERSION_MAJOR 1
#define PEERKV_ABI_VERSION_MINOR 1

/* Status codes. */
#define PEERKV_OK 0
#define PEERKV_ERR_INVALID_ARGUMENT (-1)  /* bad argument or option        */
#define PEERKV_ERR_UNKNOWN_HANDLE (-2)    /* handle was never created/closed */
#define PEERKV_ERR_BAD_PARAMS (-3)        /* malformed/forbidden kv_transfer_params */
#define PEERKV_ERR_UNKNOWN_REQUEST (-4)   /* request id not started        */
#define PEERKV_ERR_BUFFER_TOO_SMALL (-5)  /* output buffer too small; see the call */
#define PEERKV_ERR_TRANSPORT (-6)         /* bind/listen/connect failure   */
#define PEERKV_ERR_CLOSED (-7)            /* handle is shutting down        */
#define PEERKV_ERR_FORKED (-8)            /* called in a forked child       */
#define PEERKV_ERR_INTERNAL (-9)          /* recovered panic; library poisoned */
#define PEERKV_ERR_TIMEOUT (-10)          /* a bounded wait expired         */
#define PEERKV_ERR_DUPLICATE (-11)        /* duplicate job/request id       */
#define PEERKV_ERR_UNAVAILABLE (-12)      /* feature not available here (e.g. NIXL) */
#define PEERKV_ERR_ABI_MISMATCH (-13)     /* caller built for another ABI major */

/* Lookup results; values equal vLLM's LookupResult enum. */
#define PEERKV_LOOKUP_MISS 1
#define PEERKV_LOOKUP_HIT 2
#define PEERKV_LOOKUP_HIT_PENDING 3 /* only in peerkv_answer_inbound input */
#define PEERKV_LOOKUP_RETRY 4

/* How a request's lookups go (peerkv_request_lookup_mode; ABI 1.1). */
#define PEERKV_LOOKUPS_MISS 0 /* every key MISS: the request does not pull, or failed */
#define PEERKV_LOOKUPS_HIT 1  /* every key HIT until a load fails (a PD decoder) */
#define PEERKV_LOOKUPS_ASK 2  /* keys are asked of the sources (remote_kv_source) */

/* The news counts (peerkv_news; ABI 1.1), by index. */
#define PEERKV_NEWS_RESULTS 0 /* job results queued: peerkv_get_finished has work */
#define PEERKV_NEWS_ANSWERS 1 /* lookup answers changed: peerkv_take_answers has work */
#define PEERKV_NEWS_INBOUND 2 /* inbound work queued: peerkv_next_inbound has work */
#define PEERKV_NEWS_LOGS 3    /* log lines queued: peerkv_take_logs has work */
#define PEERKV_NEWS_COUNT 4

/* Offload policy returned by peerkv_request_start. */
#define PEERKV_POLICY_BLOCK_LEVEL 0
#define PEERKV_POLICY_REQUEST_LEVEL 1

/* Kinds of inbound work returned by peerkv_next_inbound. */
#define PEERKV_INBOUND_EVALUATE 1 /* look the keys up, pin the hits, answer */
#define PEERKV_INBOUND_FINISH 2   /* the lookup is over: release its context */

typedef int64_t peerkv_handle;

/* One finished job, as returned by peerkv_get_finished. */
typedef struct peerkv_job_result {
  int64_t job_id;
  int32_t success;          /* 1 = every key landed / was served, 0 = failed */
  int32_t is_load;          /* 1 = load (promotion), 0 = store (cascade/pin)  */
  int64_t bytes;            /* bytes moved by this job (0 if none)           */
  double seconds;           /* submit-to-finish time                          */
} peerkv_job_result;

/* Returns PEERKV_ABI_VERSION_MAJOR << 16 | PEERKV_ABI_VERSION_MINOR. */
uint32_t peerkv_abi_version(void);

/* Writes the library version ("peerkv 0.1.0 (go1.26.8)") into buf.
 * Returns PEERKV_OK, or PEERKV_ERR_BUFFER_TOO_SMALL (truncated). */
int32_t peerkv_version(char *buf, size_t len);

/* Writes a JSON object describing this host into buf:
 *   {"version":"...","abi":"1.0","gpus":[{"index":0,"name":"...","uuid":"GPU-...",
 *    "numa_node":0}],"nvml":"ok"|"<why not>","nixl":"ok"|"<why not>",
 *    "data_paths":{"shm":"ok (...)"|"<why not>","nixl":...,"tcp":...},
 *    "go_max_procs":4,"go_max_procs_default":4,"options_schema":"<sha256>"}
 * Works without an NVIDIA driver ("gpus":[] and the reason under "nvml").
 * *needed receives the size including NUL; PEERKV_ERR_BUFFER_TOO_SMALL if
 * len < *needed. */
int32_t peerkv_info(char *buf, size_t len, size_t *needed, char *err, size_t errlen);

/* Creates a node: the handle the other calls take.
 *   abi_major   PEERKV_ABI_VERSION_MAJOR the caller was built against.
 *   region      primary CPU region base; num_rows * row_len bytes, host-owned.
 *   options     JSON object (may be NULL or "{}"):
 *     "host" (str, default "localhost"; a wildcard such as "0.0.0.0" needs
 *       "advertise_host"), "advertise_host" (str, the host peers dial, default
 *       host), "port" (int, final port, default 5710),
 *     "config_fingerprint" (str, "" = accept any), "hash_seed" (str),
 *     "key_len" (int, 0 = unchecked),
 *     "data_transport" ("auto" (default): same-host copy, NIXL when it
 *       loads, and TCP, chosen per peer | "nixl": NIXL only | "tcp": TCP only),
 *     "same_host_copy" (bool, default true: with "auto", copy straight into
 *       peerkv peers on this host),
 *     "verify_pulls" (bool, default true: XXH3-64 of every row between
 *       peerkv peers that both offer it; a mismatch fails the load),
 *     "data_host" (str), "data_port" (int, default port + 1000,
 *       0 = ephemeral),
 *     "auth_secret" (str, peers must prove it; refuses stock vLLM peers),
 *     "max_peers" (int), "max_sources_per_request" (int, 1..16, default 4:
 *       the most sources one remote_kv_source may list),
 *     "nixl_library" (str path to libnixl_capi.so),
 *     "python_prefix" (str, a Python environment searched for the nixl wheels),
 *     "nixl_backends" ([str]), "nixl_num_threads" (int), and deadlines in
 *     seconds: "handshake_timeout_s", "lookup_timeout_s", "load_timeout_s",
 *     "abort_ack_timeout_s", "store_timeout_s", "unbound_store_timeout_s",
 *     "inbound_lookup_timeout_s", "shutdown_drain_timeout_s", "drain_timeout_s",
 *     "go_max_procs" (int, the Go runtime's size; GOMAXPROCS in the
 *       environment wins). The full schema is core/config/schema.go.
 *     Unknown keys are rejected naming the closest known one; every bad
 *     value names its key.
 * On success *out is a handle (never 0). Binding happens here: an address in
 * use fails with PEERKV_ERR_TRANSPORT. */
int32_t peerkv_create(uint32_t abi_major, void *region, uint64_t num_rows,
                      uint64_t row_len, const char *options, peerkv_handle *out,
                      char *err, size_t errlen);

/* Starts a request. kv_transfer_params_json is the request's
 * kv_transfer_params as JSON (NULL, "" or "null" = none). *policy receives a
 * PEERKV_POLICY_*. Malformed fields and forbidden combinations fail with
 * PEERKV_ERR_BAD_PARAMS and a message naming the problem; the request is then
 * not known to the library (lookups for it answer MISS). A consumer request
 * starts connecting to its sources in the background (remote_kv_source may
 * list several; a source without kv_request_id gets one minted, logged and
 * counted in "kv_ids_minted"). The accepted forms are in
 * docs/kv_transfer_params.schema.json. Starting an id twice returns
 * PEERKV_ERR_DUPLICATE. */
int32_t peerkv_request_start(peerkv_handle h, const char *req_id,
                             const char *kv_transfer_params_json, int32_t *policy,
                             char *err, size_t errlen);

/* Looks up n keys for a request; results[i] gets PEERKV_LOOKUP_HIT, _MISS or
 * _RETRY (ask again next step). Answers from local state only: a P2P consumer
 * (remote_kv_source) registers unknown keys with every source and answers
 * RETRY until a source replied HIT or all replied or passed the lookup
 * deadline (then MISS). Keys form a prefix in the order the request first
 * asked about them: a key is HIT only once every earlier key is HIT (RETRY
 * while one is RETRY, MISS after one is MISS, without asking). A PD decoder
 * (remote_prefiller) answers HIT for every key; a request that does not pull,
 * or whose pulls already failed, answers MISS. Unknown req_id: every result
 * MISS and PEERKV_OK. */
int32_t peerkv_lookup(peerkv_handle h, const char *req_id, const uint8_t *keys,
                      size_t key_len, size_t n, int32_t *results, char *err,
                      size_t errlen);

/* Sends the lookups registered during this scheduler step: one lookup message
 * per peer per request. */
int32_t peerkv_on_schedule_end(peerkv_handle h, char *err, size_t errlen);

/* Answer caching (ABI 1.1): a host may answer its scheduler's per-key
 * lookups from what it was told, with no call per key.
 *   1. After peerkv_request_start, peerkv_request_lookup_mode says how the
 *      request's lookups go (PEERKV_LOOKUPS_*): MISS and HIT need no call per
 *      key; from this call on, the library also reports the request's
 *      changed answers (a PD decoder's failure too) to peerkv_take_answers.
 *   2. For ASK requests the host sends the keys it never asked, of every
 *      request, in one peerkv_lookup_many per step, and caches each answer.
 *      It need not ask again about a key it was told RETRY: the library
 *      re-evaluates those keys itself whenever their sources answer.
 *   3. When the PEERKV_NEWS_ANSWERS count moved, peerkv_take_answers gives
 *      what changed. After a peerkv_submit_load the request's answers start
 *      over (its sources' lookups are closed by the fetch): forget them and
 *      ask again about any key the scheduler looks up again. */
int32_t peerkv_request_lookup_mode(peerkv_handle h, const char *req_id, int32_t *mode,
                                   char *err, size_t errlen);

/* peerkv_lookup for several requests, then peerkv_on_schedule_end, in one
 * call: request i (req_ids[i]) asks counts[i] keys, taken in order from keys;
 * results gets one PEERKV_LOOKUP_* per key, in the same order. A call asking
 * at most 256 keys in all registers them and sends their lookups itself, and
 * answers what is known already. In a larger call, the first ask of a request
 * whose lookup mode was asked is answered RETRY for every key at once; the
 * library registers its keys and sends its lookups on its own thread, and an
 * answer known already comes as a change (peerkv_take_answers). */
int32_t peerkv_lookup_many(peerkv_handle h, size_t n_requests, const char *const *req_ids,
                           const size_t *counts, const uint8_t *keys, size_t key_len,
                           int32_t *results, char *err, size_t errlen);

/* Moves the changed answers of requests whose lookup mode was asked into
 * buf, as records of little-endian fields, each starting 4-byte aligned:
 *   uint32 id_len, id_len bytes of req_id, uint32 flags (1 = the request
 *   failed: every key MISS from now on; n is then 0), uint32 n, n x uint32
 *   positions, n x uint8 results (PEERKV_LOOKUP_*), zero padding to 4 bytes.
 * A position indexes the request's keys in the order it first asked about
 * them (across peerkv_lookup_many calls; keys asked again keep theirs).
 * *n_out receives the bytes written (0: nothing changed). Records that do
 * not fit stay queued for the next call (and move the news count again);
 * call until *n_out is 0. When not even the first fits, the call fails with
 * PEERKV_ERR_BUFFER_TOO_SMALL and *n_out is the size needed. */
int32_t peerkv_take_answers(peerkv_handle h, uint8_t *buf, size_t len, size_t *n_out,
                            char *err, size_t errlen);

/* Probes peer ("host:port") with a handshake only (ABI 1.1; `peerkv doctor`):
 * opens a session, waits up to timeout_s for the handshake to finish or
 * fail, then closes it orderly (the peer sees a connect and a goodbye). Writes
 * a JSON object into buf (size protocol of peerkv_stats; a retry probes
 * again): "peer", "handshake" (bool), "connect" (the peer's connect as it
 * arrived: peer_id, block_len, num_blocks, config_fingerprint, hash_seed,
 * peerkv, peerkv_version, data_transport; absent when a peerkv peer refused
 * ours first, as it tells a refused stranger no values), "refused" (the
 * fields of our connect a peerkv peer named as differing), "cause" and
 * "reason" (why the handshake failed), "rtt_ms". A failed handshake is a
 * result, not an error; PEERKV_ERR_INVALID_ARGUMENT if this handle has a
 * session with peer already. */
int32_t peerkv_probe(peerkv_handle h, const char *peer, double timeout_s, char *buf,
                     size_t len, size_t *needed, char *err, size_t errlen);

/* Points *words at PEERKV_NEWS_COUNT counters the host may read at any time
 * without calling in: each grows when something of its kind is queued for
 * the host (and all once when the node shuts down or is poisoned). A count
 * the host has seen already means that call has nothing to do, so an idle
 * host makes no call. Read each as one aligned 64-bit load. The memory stays
 * mapped for the life of the process (after peerkv_destroy it no longer
 * changes). Fails with PEERKV_ERR_UNAVAILABLE if it could not be mapped. */
int32_t peerkv_news(peerkv_handle h, const volatile uint64_t **words, char *err,
                    size_t errlen);

/* Submits a load: pull n keys from the request's sources into rows slots[i],
 * each from one source that reported it (a long load is spread over the
 * sources holding it; a source that fails mid-load is replaced by another
 * within the load's deadline).
 * The job is always reported exactly once by peerkv_get_finished, success or
 * failure, within load_timeout_s + abort_ack_timeout_s. Bad arguments (slot
 * out of range, wrong key length, duplicate job id) fail the call and submit
 * nothing. */
int32_t peerkv_submit_load(peerkv_handle h, const char *req_id, int64_t job_id,
                           const uint8_t *keys, size_t key_len, size_t n,
                           const int64_t *slots, char *err, size_t errlen);

/* Submits a store: rows slots[i] hold keys[i] and stay pinned by the host
 * until this job is reported. For a prefill producer (remote_decoder) the rows
 * are served to the decoder that fetches the request's kv_request_id; for any
 * other request the job succeeds at once. Reported exactly once. */
int32_t peerkv_submit_store(peerkv_handle h, const char *req_id, int64_t job_id,
                            const uint8_t *keys, size_t key_len, size_t n,
                            const int64_t *slots, char *err, size_t errlen);

/* Moves up to cap finished jobs into out; *n_out receives the count. Call
 * again while *n_out == cap. */
int32_t peerkv_get_finished(peerkv_handle h, peerkv_job_result *out, size_t cap,
                            size_t *n_out, char *err, size_t errlen);

/* Pops the next piece of inbound work (lookups from remote consumers).
 *   *lookup_id   identifies the inbound lookup in peerkv_answer_inbound.
 *   *kind        PEERKV_INBOUND_EVALUATE or PEERKV_INBOUND_FINISH.
 *   req_id_buf   receives the synthetic request id for the host's
 *                bookkeeping, "p2p:<peer>:<kv_request_id>:lu<n>" (NUL-terminated).
 *   keys_buf     receives the keys to evaluate (EVALUATE only), *n_keys of them,
 *                each key_len bytes (the configured key length): at most 256;
 *                a larger lookup comes as several EVALUATEs of one lookup_id.
 *   *first       1 if this is the lookup's first EVALUATE (start its context).
 * Returns PEERKV_OK with work, 1 when there is none, or
 * PEERKV_ERR_BUFFER_TOO_SMALL with *req_id_needed / *n_keys set and the work
 * left in place. Every EVALUATE must be answered with peerkv_answer_inbound;
 * every lookup that was evaluated ends in exactly one FINISH (or in
 * *finished from peerkv_answer_inbound). */
int32_t peerkv_next_inbound(peerkv_handle h, int64_t *lookup_id, int32_t *kind,
                            int32_t *first, char *req_id_buf, size_t req_id_cap,
                            size_t *req_id_needed, uint8_t *keys_buf,
                            size_t keys_cap, size_t *n_keys, char *err,
                            size_t errlen);

/* Answers an EVALUATE: results[i] is the host's PEERKV_LOOKUP_* for the i-th
 * key of that EVALUATE. The hits (results == HIT) must already be pinned as one
 * host job: pin_job_id and pin_slots[j] (the row of the j-th hit, in key
 * order); pass pin_job_id < 0 and n_pins = 0 when there are no hits. The pin job
 * is reported exactly once through peerkv_get_finished (as a store), which
 * is when the host unpins. HIT_PENDING/RETRY keys are offered again in a later
 * EVALUATE until inbound_lookup_timeout_s, then answered MISS.
 * *finished is set to 1 when the lookup is complete and its context may be
 * released now (no FINISH will follow). */
int32_t peerkv_answer_inbound(peerkv_handle h, int64_t lookup_id,
                              const int32_t *results, size_t n, int64_t pin_job_id,
                              const int64_t *pin_slots, size_t n_pins,
                              int32_t *finished, char *err, size_t errlen);

/* Finishes a request: aborts its loads in flight (still reported), sends the
 * terminal fetch where the source holds lookup state, and finalizes what it
 * serves. Unknown req_id is PEERKV_OK. */
int32_t peerkv_request_finish(peerkv_handle h, const char *req_id, char *err,
                              size_t errlen);

/* 1 while the node has work that needs the host to keep calling (jobs in
 * flight or unreported, inbound lookups queued, sessions handshaking), else 0.
 * Negative on error. */
int32_t peerkv_has_pending_work(peerkv_handle h);

/* Returns (>= 0) a file descriptor the host may poll()/select()/epoll on to
 * learn when to call in, or a negative PEERKV_ERR_* with the message in err.
 * It is an eventfd (EFD_NONBLOCK | EFD_CLOEXEC) owned by the library, created
 * on the first call (later calls return the same fd): the host must not close
 * or write it. It stays open after peerkv_shutdown and is closed by
 * peerkv_destroy, so stop every thread waiting on it before destroying.
 * The library makes it readable (adds 1; signals coalesce) whenever
 * something appears that the host must collect with a call:
 *   - an inbound item for peerkv_next_inbound (EVALUATE or FINISH, including
 *     the re-offer of keys answered HIT_PENDING/RETRY, which follows at once:
 *     a host that keeps answering those is woken for each pass),
 *   - a job result for peerkv_get_finished,
 *   - changed lookup answers for peerkv_take_answers (once per request
 *     until they are taken),
 *   - and once when the node shuts down or is stopped by an internal error.
 * Items queued before the first call make it readable at once. It is never
 * signalled for nothing new, and a signal never blocks the library.
 * Order, so nothing is missed: when it is readable, first read(2) its 8 bytes
 * (resets it; EAGAIN means another reader got there), then call
 * peerkv_get_finished until it returns fewer than cap,
 * peerkv_next_inbound until it returns 1 and peerkv_take_answers until it
 * has nothing more, then wait again. Anything queued
 * after the read makes it readable again. */
int32_t peerkv_notify_fd(peerkv_handle h, char *err, size_t errlen);

/* Blocks until every submitted job has finished or drain_timeout_s passed.
 * Never aborts a transfer midway. Returns PEERKV_ERR_TIMEOUT if jobs remain
 * after the deadline (they are still reported later). */
int32_t peerkv_drain(peerkv_handle h, char *err, size_t errlen);

/* Writes a JSON object of counters and gauges into buf (same size protocol as
 * peerkv_info): local_id, data_paths (the data paths served, e.g.
 * "shm+nixl+tcp"), sessions, lookups, hits, misses, bytes, transfers,
 * failures by cause, parked stores, pinned rows; "peers", one object per live
 * session with its "link" (round trips, setup, fitted pull cost; docs/links.md),
 * at most once a second (null in between; a call refused for a too small
 * buffer does not count). */
int32_t peerkv_stats(peerkv_handle h, char *buf, size_t len, size_t *needed,
                     char *err, size_t errlen);

/* Moves up to len-1 bytes of pending log lines ("LEVEL message\n" each) into
 * buf; *n_out receives the byte count (0 when none). Lines that do not fit
 * stay queued. The queue is bounded; overflow drops the oldest lines and says
 * so in the next line. */
int32_t peerkv_take_logs(peerkv_handle h, char *buf, size_t len, size_t *n_out);

/* Shuts the node down: drains transfers for shutdown_drain_timeout_s, fails
 * every job not yet finished (they are still returned by a final
 * peerkv_get_finished on this handle, which stays valid for that until
 * peerkv_destroy), closes sockets. Idempotent, and safe to call from several
 * threads at once and alongside peerkv_destroy: every caller returns only
 * after the one teardown finished, and those that overlap it get its result
 * (PEERKV_OK unless closing it failed). A shutdown of a handle whose destroy
 * already finished, even one that raced that destroy and entered only after
 * it returned, has nothing left to tear down and returns PEERKV_OK, like a
 * second peerkv_destroy; handles are never reused, so it cannot reach another
 * node. PEERKV_ERR_UNKNOWN_HANDLE only for a handle never created. */
int32_t peerkv_shutdown(peerkv_handle h, char *err, size_t errlen);

/* Releases the handle (shutting down first if needed). The region may be
 * unmapped after this returns, whichever thread's call returns. Idempotent
 * for a released handle; a second destroy while the first still shuts down
 * waits for that teardown. Every call but peerkv_shutdown and peerkv_destroy
 * on a destroyed handle returns PEERKV_ERR_UNKNOWN_HANDLE. */
int32_t peerkv_destroy(peerkv_handle h, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* PEERKV_H */
