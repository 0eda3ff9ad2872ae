// Declarations of the subset of NIXL's C API (nixl_capi_*) that peerkv calls,
// written from src/bindings/rust/wrapper.h of ai-dynamo/nixl (the agent
// config struct and every signature below are unchanged from v1.4.0 to the
// 1.5.1 wheels; see docs/nixl.md). peerkv never links NIXL: the functions are
// reached through a table filled by dlopen/dlsym at run time.
#ifndef PEERKV_NIXL_CAPI_H
#define PEERKV_NIXL_CAPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef int nixl_status; // nixl_capi_status_t: 0 ok, 1 in progress, <0 error

enum {
	PKV_NIXL_SUCCESS = 0,
	PKV_NIXL_IN_PROG = 1,
	PKV_NIXL_MEM_DRAM = 0,
	PKV_NIXL_XFER_WRITE = 1,
	PKV_NIXL_THREAD_SYNC_NONE = 0,
};

// Opaque handles.
typedef void *nixl_agent;
typedef void *nixl_params;
typedef void *nixl_backend;
typedef void *nixl_reg_dlist;
typedef void *nixl_xfer_dlist;
typedef void *nixl_dlist_handle;
typedef void *nixl_xfer_req;

// nixl_capi_agent_config_t, field for field.
typedef struct {
	bool enable_prog_thread;
	bool enable_listen_thread;
	int listen_port;
	int thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
} nixl_agent_config;

// Loads the library at path and resolves every function. Returns NULL on
// success, else a malloc'd message the caller frees.
char *pkv_nixl_load(const char *path);

// Path of an already-loaded libnixl.so in this process (e.g. by Python's nixl
// package), or NULL. The string is malloc'd; the caller frees it.
char *pkv_nixl_loaded_libnixl_path(void);

bool pkv_nixl_is_stub(void);

nixl_status pkv_nixl_create_configured_agent(const char *name, const nixl_agent_config *cfg, nixl_agent *agent);
nixl_status pkv_nixl_destroy_agent(nixl_agent agent);
nixl_status pkv_nixl_get_local_md(nixl_agent agent, void **data, size_t *len);
nixl_status pkv_nixl_load_remote_md(nixl_agent agent, const void *data, size_t len, char **agent_name);
nixl_status pkv_nixl_invalidate_remote_md(nixl_agent agent, const char *remote_agent);

nixl_status pkv_nixl_create_params(nixl_params *params);
nixl_status pkv_nixl_params_add(nixl_params params, const char *key, const char *value);
nixl_status pkv_nixl_destroy_params(nixl_params params);
nixl_status pkv_nixl_create_backend(nixl_agent agent, const char *plugin, nixl_params params, nixl_backend *backend);
nixl_status pkv_nixl_destroy_backend(nixl_backend backend);

nixl_status pkv_nixl_create_reg_dlist(int mem_type, nixl_reg_dlist *dlist);
nixl_status pkv_nixl_reg_dlist_add_desc(nixl_reg_dlist dlist, uintptr_t addr, size_t len, uint64_t dev_id);
nixl_status pkv_nixl_destroy_reg_dlist(nixl_reg_dlist dlist);
nixl_status pkv_nixl_register_mem(nixl_agent agent, nixl_reg_dlist dlist);
nixl_status pkv_nixl_deregister_mem(nixl_agent agent, nixl_reg_dlist dlist);

nixl_status pkv_nixl_create_xfer_dlist(int mem_type, nixl_xfer_dlist *dlist);
nixl_status pkv_nixl_xfer_dlist_add_desc(nixl_xfer_dlist dlist, uintptr_t addr, size_t len, uint64_t dev_id);
nixl_status pkv_nixl_destroy_xfer_dlist(nixl_xfer_dlist dlist);
nixl_status pkv_nixl_prep_xfer_dlist(nixl_agent agent, const char *agent_name, nixl_xfer_dlist descs, nixl_dlist_handle *handle);
nixl_status pkv_nixl_release_xfer_dlist_handle(nixl_agent agent, nixl_dlist_handle handle);

nixl_status pkv_nixl_make_xfer_req(nixl_agent agent, int op, nixl_dlist_handle local, const int *local_idx,
                                   nixl_dlist_handle remote, const int *remote_idx, size_t count, nixl_xfer_req *req);
nixl_status pkv_nixl_post_xfer_req(nixl_agent agent, nixl_xfer_req req);
nixl_status pkv_nixl_get_xfer_status(nixl_agent agent, nixl_xfer_req req);
nixl_status pkv_nixl_release_xfer_req(nixl_agent agent, nixl_xfer_req req);
nixl_status pkv_nixl_destroy_xfer_req(nixl_xfer_req req);

// Region helpers: one call per region instead of one cgo call per row.
nixl_status pkv_nixl_add_row_descs(nixl_xfer_dlist dlist, uintptr_t base, uint64_t num_rows, uint64_t row_len);

#endif
