// Run-time binding to libnixl_capi.so: dlopen + dlsym into a function table,
// and call-through shims that cgo can call (cgo cannot call C function
// pointers directly).
#define _GNU_SOURCE
#include "capi.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
	bool (*is_stub)(void);
	nixl_status (*create_configured_agent)(const char *, const nixl_agent_config *, nixl_agent *);
	nixl_status (*destroy_agent)(nixl_agent);
	nixl_status (*get_local_md)(nixl_agent, void **, size_t *);
	nixl_status (*load_remote_md)(nixl_agent, const void *, size_t, char **);
	nixl_status (*invalidate_remote_md)(nixl_agent, const char *);
	nixl_status (*create_params)(nixl_params *);
	nixl_status (*params_add)(nixl_params, const char *, const char *);
	nixl_status (*destroy_params)(nixl_params);
	nixl_status (*create_backend)(nixl_agent, const char *, nixl_params, nixl_backend *);
	nixl_status (*destroy_backend)(nixl_backend);
	nixl_status (*create_reg_dlist)(int, nixl_reg_dlist *);
	nixl_status (*reg_dlist_add_desc)(nixl_reg_dlist, uintptr_t, size_t, uint64_t, const void *, size_t);
	nixl_status (*destroy_reg_dlist)(nixl_reg_dlist);
	nixl_status (*register_mem)(nixl_agent, nixl_reg_dlist, void *);
	nixl_status (*deregister_mem)(nixl_agent, nixl_reg_dlist, void *);
	nixl_status (*create_xfer_dlist)(int, nixl_xfer_dlist *);
	nixl_status (*xfer_dlist_add_desc)(nixl_xfer_dlist, uintptr_t, size_t, uint64_t);
	nixl_status (*destroy_xfer_dlist)(nixl_xfer_dlist);
	nixl_status (*prep_xfer_dlist)(nixl_agent, const char *, nixl_xfer_dlist, nixl_dlist_handle *, void *);
	nixl_status (*release_xfer_dlist_handle)(nixl_agent, nixl_dlist_handle);
	nixl_status (*make_xfer_req)(nixl_agent, int, nixl_dlist_handle, const int *, size_t, nixl_dlist_handle,
	                             const int *, size_t, nixl_xfer_req *, void *);
	nixl_status (*post_xfer_req)(nixl_agent, nixl_xfer_req, void *);
	nixl_status (*get_xfer_status)(nixl_agent, nixl_xfer_req);
	nixl_status (*release_xfer_req)(nixl_agent, nixl_xfer_req);
	nixl_status (*destroy_xfer_req)(nixl_xfer_req);
} fn;

static char *dup_message(const char *prefix, const char *detail) {
	size_t n = strlen(prefix) + strlen(detail) + 1;
	char *msg = malloc(n);
	if (msg != NULL) {
		snprintf(msg, n, "%s%s", prefix, detail);
	}
	return msg;
}

#define RESOLVE(field, symbol)                                             \
	do {                                                                   \
		*(void **)(&fn.field) = dlsym(lib, symbol);                        \
		if (fn.field == NULL) {                                            \
			char *msg = dup_message("missing symbol ", symbol);            \
			memset(&fn, 0, sizeof fn);                                     \
			return msg;                                                    \
		}                                                                  \
	} while (0)

char *pkv_nixl_load(const char *path) {
	// RTLD_LOCAL: NIXL's C++/UCX symbols must not leak into the host's
	// global namespace. The handle is never closed: UCX cannot be unloaded.
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		const char *err = dlerror();
		return dup_message("dlopen: ", err ? err : "unknown error");
	}
	RESOLVE(is_stub, "nixl_capi_is_stub");
	RESOLVE(create_configured_agent, "nixl_capi_create_configured_agent");
	RESOLVE(destroy_agent, "nixl_capi_destroy_agent");
	RESOLVE(get_local_md, "nixl_capi_get_local_md");
	RESOLVE(load_remote_md, "nixl_capi_load_remote_md");
	RESOLVE(invalidate_remote_md, "nixl_capi_invalidate_remote_md");
	RESOLVE(create_params, "nixl_capi_create_params");
	RESOLVE(params_add, "nixl_capi_params_add");
	RESOLVE(destroy_params, "nixl_capi_destroy_params");
	RESOLVE(create_backend, "nixl_capi_create_backend");
	RESOLVE(destroy_backend, "nixl_capi_destroy_backend");
	RESOLVE(create_reg_dlist, "nixl_capi_create_reg_dlist");
	RESOLVE(reg_dlist_add_desc, "nixl_capi_reg_dlist_add_desc");
	RESOLVE(destroy_reg_dlist, "nixl_capi_destroy_reg_dlist");
	RESOLVE(register_mem, "nixl_capi_register_mem");
	RESOLVE(deregister_mem, "nixl_capi_deregister_mem");
	RESOLVE(create_xfer_dlist, "nixl_capi_create_xfer_dlist");
	RESOLVE(xfer_dlist_add_desc, "nixl_capi_xfer_dlist_add_desc");
	RESOLVE(destroy_xfer_dlist, "nixl_capi_destroy_xfer_dlist");
	RESOLVE(prep_xfer_dlist, "nixl_capi_prep_xfer_dlist");
	RESOLVE(release_xfer_dlist_handle, "nixl_capi_release_xfer_dlist_handle");
	RESOLVE(make_xfer_req, "nixl_capi_make_xfer_req");
	RESOLVE(post_xfer_req, "nixl_capi_post_xfer_req");
	RESOLVE(get_xfer_status, "nixl_capi_get_xfer_status");
	RESOLVE(release_xfer_req, "nixl_capi_release_xfer_req");
	RESOLVE(destroy_xfer_req, "nixl_capi_destroy_xfer_req");
	return NULL;
}

static int find_libnixl(struct dl_phdr_info *info, size_t size, void *data) {
	(void)size;
	const char *name = info->dlpi_name;
	size_t n = name ? strlen(name) : 0;
	static const char suffix[] = "/libnixl.so";
	if (n >= sizeof suffix - 1 && strcmp(name + n - (sizeof suffix - 1), suffix) == 0) {
		*(char **)data = strdup(name);
		return 1;
	}
	return 0;
}

char *pkv_nixl_loaded_libnixl_path(void) {
	char *path = NULL;
	dl_iterate_phdr(find_libnixl, &path);
	return path;
}

bool pkv_nixl_is_stub(void) { return fn.is_stub(); }

nixl_status pkv_nixl_create_configured_agent(const char *name, const nixl_agent_config *cfg, nixl_agent *agent) {
	return fn.create_configured_agent(name, cfg, agent);
}
nixl_status pkv_nixl_destroy_agent(nixl_agent agent) { return fn.destroy_agent(agent); }
nixl_status pkv_nixl_get_local_md(nixl_agent agent, void **data, size_t *len) {
	return fn.get_local_md(agent, data, len);
}
nixl_status pkv_nixl_load_remote_md(nixl_agent agent, const void *data, size_t len, char **agent_name) {
	return fn.load_remote_md(agent, data, len, agent_name);
}
nixl_status pkv_nixl_invalidate_remote_md(nixl_agent agent, const char *remote_agent) {
	return fn.invalidate_remote_md(agent, remote_agent);
}

nixl_status pkv_nixl_create_params(nixl_params *params) { return fn.create_params(params); }
nixl_status pkv_nixl_params_add(nixl_params params, const char *key, const char *value) {
	return fn.params_add(params, key, value);
}
nixl_status pkv_nixl_destroy_params(nixl_params params) { return fn.destroy_params(params); }
nixl_status pkv_nixl_create_backend(nixl_agent agent, const char *plugin, nixl_params params, nixl_backend *backend) {
	return fn.create_backend(agent, plugin, params, backend);
}
nixl_status pkv_nixl_destroy_backend(nixl_backend backend) { return fn.destroy_backend(backend); }

nixl_status pkv_nixl_create_reg_dlist(int mem_type, nixl_reg_dlist *dlist) {
	return fn.create_reg_dlist(mem_type, dlist);
}
nixl_status pkv_nixl_reg_dlist_add_desc(nixl_reg_dlist dlist, uintptr_t addr, size_t len, uint64_t dev_id) {
	return fn.reg_dlist_add_desc(dlist, addr, len, dev_id, NULL, 0);
}
nixl_status pkv_nixl_destroy_reg_dlist(nixl_reg_dlist dlist) { return fn.destroy_reg_dlist(dlist); }
nixl_status pkv_nixl_register_mem(nixl_agent agent, nixl_reg_dlist dlist) {
	return fn.register_mem(agent, dlist, NULL);
}
nixl_status pkv_nixl_deregister_mem(nixl_agent agent, nixl_reg_dlist dlist) {
	return fn.deregister_mem(agent, dlist, NULL);
}

nixl_status pkv_nixl_create_xfer_dlist(int mem_type, nixl_xfer_dlist *dlist) {
	return fn.create_xfer_dlist(mem_type, dlist);
}
nixl_status pkv_nixl_xfer_dlist_add_desc(nixl_xfer_dlist dlist, uintptr_t addr, size_t len, uint64_t dev_id) {
	return fn.xfer_dlist_add_desc(dlist, addr, len, dev_id);
}
nixl_status pkv_nixl_destroy_xfer_dlist(nixl_xfer_dlist dlist) { return fn.destroy_xfer_dlist(dlist); }
nixl_status pkv_nixl_prep_xfer_dlist(nixl_agent agent, const char *agent_name, nixl_xfer_dlist descs,
                                     nixl_dlist_handle *handle) {
	return fn.prep_xfer_dlist(agent, agent_name, descs, handle, NULL);
}
nixl_status pkv_nixl_release_xfer_dlist_handle(nixl_agent agent, nixl_dlist_handle handle) {
	return fn.release_xfer_dlist_handle(agent, handle);
}

nixl_status pkv_nixl_make_xfer_req(nixl_agent agent, int op, nixl_dlist_handle local, const int *local_idx,
                                   nixl_dlist_handle remote, const int *remote_idx, size_t count, nixl_xfer_req *req) {
	return fn.make_xfer_req(agent, op, local, local_idx, count, remote, remote_idx, count, req, NULL);
}
nixl_status pkv_nixl_post_xfer_req(nixl_agent agent, nixl_xfer_req req) { return fn.post_xfer_req(agent, req, NULL); }
nixl_status pkv_nixl_get_xfer_status(nixl_agent agent, nixl_xfer_req req) { return fn.get_xfer_status(agent, req); }
nixl_status pkv_nixl_release_xfer_req(nixl_agent agent, nixl_xfer_req req) { return fn.release_xfer_req(agent, req); }
nixl_status pkv_nixl_destroy_xfer_req(nixl_xfer_req req) { return fn.destroy_xfer_req(req); }

nixl_status pkv_nixl_add_row_descs(nixl_xfer_dlist dlist, uintptr_t base, uint64_t num_rows, uint64_t row_len) {
	for (uint64_t i = 0; i < num_rows; i++) {
		nixl_status st = fn.xfer_dlist_add_desc(dlist, base + i * row_len, row_len, 0);
		if (st != PKV_NIXL_SUCCESS) {
			return st;
		}
	}
	return PKV_NIXL_SUCCESS;
}
