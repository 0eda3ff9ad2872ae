/* wrappers.c — the public peerkv_* symbols.
 *
 * Each one first refuses a forked child in pure C (entering the Go runtime
 * there can hang forever), then forwards to its pkvgo_* Go export. Only the
 * peerkv_* names are exported from libpeerkv.so (exports.map). */
#include "peerkv.h"
#include "forkguard.h"
#include "_cgo_export.h"

#define REFUSE_FORKED(err, errlen)                   \
  do {                                               \
    if (pkv_in_forked_child((err), (errlen)))        \
      return PEERKV_ERR_FORKED;                      \
  } while (0)

uint32_t peerkv_abi_version(void) {
  return ((uint32_t)PEERKV_ABI_VERSION_MAJOR << 16) | PEERKV_ABI_VERSION_MINOR;
}

int32_t peerkv_version(char *buf, size_t len) {
  REFUSE_FORKED(buf, len);
  return pkvgo_version(buf, len);
}

int32_t peerkv_info(char *buf, size_t len, size_t *needed, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_info(buf, len, needed, err, errlen);
}

int32_t peerkv_create(uint32_t abi_major, void *region, uint64_t num_rows,
                      uint64_t row_len, const char *options, peerkv_handle *out,
                      char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_create(abi_major, region, num_rows, row_len, (char *)options, out, err, errlen);
}

int32_t peerkv_request_start(peerkv_handle h, const char *req_id,
                             const char *kv_transfer_params_json, int32_t *policy,
                             char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_request_start(h, (char *)req_id, (char *)kv_transfer_params_json, policy, err, errlen);
}

int32_t peerkv_lookup(peerkv_handle h, const char *req_id, const uint8_t *keys,
                      size_t key_len, size_t n, int32_t *results, char *err,
                      size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_lookup(h, (char *)req_id, (uint8_t *)keys, key_len, n, results, err, errlen);
}

int32_t peerkv_on_schedule_end(peerkv_handle h, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_on_schedule_end(h, err, errlen);
}

int32_t peerkv_request_lookup_mode(peerkv_handle h, const char *req_id, int32_t *mode,
                                   char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_request_lookup_mode(h, (char *)req_id, mode, err, errlen);
}

int32_t peerkv_lookup_many(peerkv_handle h, size_t n_requests, const char *const *req_ids,
                           const size_t *counts, const uint8_t *keys, size_t key_len,
                           int32_t *results, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_lookup_many(h, n_requests, (char **)req_ids, (size_t *)counts, (uint8_t *)keys, key_len,
                           results, err, errlen);
}

int32_t peerkv_take_answers(peerkv_handle h, uint8_t *buf, size_t len, size_t *n_out,
                            char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_take_answers(h, buf, len, n_out, err, errlen);
}

int32_t peerkv_probe(peerkv_handle h, const char *peer, double timeout_s, char *buf,
                     size_t len, size_t *needed, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_probe(h, (char *)peer, timeout_s, buf, len, needed, err, errlen);
}

int32_t peerkv_news(peerkv_handle h, const volatile uint64_t **words, char *err,
                    size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_news(h, (void **)words, err, errlen);
}

int32_t peerkv_submit_load(peerkv_handle h, const char *req_id, int64_t job_id,
                           const uint8_t *keys, size_t key_len, size_t n,
                           const int64_t *slots, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_submit_load(h, (char *)req_id, job_id, (uint8_t *)keys, key_len, n, (int64_t *)slots, err, errlen);
}

int32_t peerkv_submit_store(peerkv_handle h, const char *req_id, int64_t job_id,
                            const uint8_t *keys, size_t key_len, size_t n,
                            const int64_t *slots, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_submit_store(h, (char *)req_id, job_id, (uint8_t *)keys, key_len, n, (int64_t *)slots, err, errlen);
}

int32_t peerkv_get_finished(peerkv_handle h, peerkv_job_result *out, size_t cap,
                            size_t *n_out, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_get_finished(h, out, cap, n_out, err, errlen);
}

int32_t peerkv_next_inbound(peerkv_handle h, int64_t *lookup_id, int32_t *kind,
                            int32_t *first, char *req_id_buf, size_t req_id_cap,
                            size_t *req_id_needed, uint8_t *keys_buf,
                            size_t keys_cap, size_t *n_keys, char *err,
                            size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_next_inbound(h, lookup_id, kind, first, req_id_buf, req_id_cap, req_id_needed,
                            keys_buf, keys_cap, n_keys, err, errlen);
}

int32_t peerkv_answer_inbound(peerkv_handle h, int64_t lookup_id,
                              const int32_t *results, size_t n, int64_t pin_job_id,
                              const int64_t *pin_slots, size_t n_pins,
                              int32_t *finished, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_answer_inbound(h, lookup_id, (int32_t *)results, n, pin_job_id, (int64_t *)pin_slots,
                              n_pins, finished, err, errlen);
}

int32_t peerkv_request_finish(peerkv_handle h, const char *req_id, char *err,
                              size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_request_finish(h, (char *)req_id, err, errlen);
}

int32_t peerkv_has_pending_work(peerkv_handle h) {
  REFUSE_FORKED(NULL, 0);
  return pkvgo_has_pending_work(h);
}

int32_t peerkv_notify_fd(peerkv_handle h, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_notify_fd(h, err, errlen);
}

int32_t peerkv_drain(peerkv_handle h, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_drain(h, err, errlen);
}

int32_t peerkv_stats(peerkv_handle h, char *buf, size_t len, size_t *needed,
                     char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_stats(h, buf, len, needed, err, errlen);
}

int32_t peerkv_take_logs(peerkv_handle h, char *buf, size_t len, size_t *n_out) {
  REFUSE_FORKED(NULL, 0);
  return pkvgo_take_logs(h, buf, len, n_out);
}

int32_t peerkv_shutdown(peerkv_handle h, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_shutdown(h, err, errlen);
}

int32_t peerkv_destroy(peerkv_handle h, char *err, size_t errlen) {
  REFUSE_FORKED(err, errlen);
  return pkvgo_destroy(h, err, errlen);
}
