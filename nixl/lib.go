// Package nixl is peerkv's NIXL data transport: one-sided WRITEs from local
// rows into a peer's rows, wire-compatible with vLLM's Python NixlTransport.
//
// NIXL is loaded at run time (dlopen of libnixl_capi.so); peerkv has no
// link-time dependency on it, so everything else builds and runs without it.
package nixl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unsafe"
)

// LibEnv names the environment variable that may point at libnixl_capi.so.
const LibEnv = "PEERKV_NIXL_LIB"

const capiName = "libnixl_capi.so"

// ErrUnavailable wraps every failure to find or load NIXL.
var ErrUnavailable = errors.New("NIXL unavailable")

// The library is process-wide: UCX must exist once per process.
var lib struct {
	sync.Mutex
	path string // set once loaded
}

// Available reports whether NIXL can be loaded from the default location,
// loading it if needed; the string is the path loaded or the reason not.
func Available() (bool, string) {
	path, err := Load("")
	if err != nil {
		return false, err.Error()
	}
	return true, path
}

// Load loads libnixl_capi.so once per process and returns the path in use.
// An empty path means the default search (see FindLibrary), in prefixes
// first. Loading a second, different path is refused: two NIXL/UCX copies
// in one process conflict.
func Load(path string, prefixes ...string) (string, error) {
	lib.Lock()
	defer lib.Unlock()
	if lib.path != "" {
		if path != "" && !samePath(path, lib.path) {
			return "", fmt.Errorf("%w: %s already loaded, refusing a second copy from %s", ErrUnavailable, lib.path, path)
		}
		return lib.path, nil
	}
	if path == "" {
		found, err := FindLibrary(prefixes...)
		if err != nil {
			return "", err
		}
		path = found
	}
	// UCX reads its error-handling options when its libraries load, which
	// may happen inside this dlopen, so the environment is fixed first.
	prepareUCXEnv()
	cPath := C.CString(path)
	defer C.free(unsafe.Pointer(cPath))
	if msg := C.pkv_nixl_load(cPath); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		return "", fmt.Errorf("%w: %s: %s", ErrUnavailable, path, C.GoString(msg))
	}
	if C.pkv_nixl_is_stub() {
		return "", fmt.Errorf("%w: %s is NIXL's stub library (built without NIXL)", ErrUnavailable, path)
	}
	lib.path = path
	return path, nil
}

// FindLibrary locates libnixl_capi.so, in order: $PEERKV_NIXL_LIB; next to a
// libnixl.so this process already loaded (Python's nixl package inside
// vLLM, so both share one UCX); the nixl_cu12 / nixl_cu13 wheels of the
// given Python prefixes, of $VIRTUAL_ENV, or of the Python prefixes on $PATH.
func FindLibrary(prefixes ...string) (string, error) {
	if p := os.Getenv(LibEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", ErrUnavailable, LibEnv, p, err)
		}
		return p, nil
	}
	if loaded := C.pkv_nixl_loaded_libnixl_path(); loaded != nil {
		dir := filepath.Dir(C.GoString(loaded))
		C.free(unsafe.Pointer(loaded))
		if p := filepath.Join(dir, capiName); fileExists(p) {
			return p, nil
		}
	}
	var searched []string
	for _, prefix := range pythonPrefixes(prefixes) {
		for _, pkg := range []string{".nixl_cu12.mesonpy.libs", ".nixl_cu13.mesonpy.libs"} {
			pattern := filepath.Join(prefix, "lib", "python3*", "*-packages", pkg, capiName)
			searched = append(searched, pattern)
			matches, _ := filepath.Glob(pattern)
			sort.Strings(matches)
			if len(matches) > 0 {
				return matches[len(matches)-1], nil
			}
		}
	}
	return "", fmt.Errorf("%w: %s not found (set %s; searched %v)", ErrUnavailable, capiName, LibEnv, searched)
}

// pythonPrefixes lists environments that may hold the nixl wheels: the
// given ones, the environment of the Python running this process, then
// $VIRTUAL_ENV and the parent of every $PATH entry holding a python3.
func pythonPrefixes(given []string) []string {
	var prefixes []string
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			prefixes = append(prefixes, p)
		}
	}
	for _, p := range given {
		add(p)
	}
	add(interpreterPrefix())
	add(os.Getenv("VIRTUAL_ENV"))
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if fileExists(filepath.Join(dir, "python3")) {
			add(filepath.Dir(dir))
		}
	}
	return prefixes
}

// interpreterPrefix is the environment of the Python interpreter this
// library was loaded into, found as Python finds it: argv[0] is
// ENV/bin/python* (a venv's bin/python is a symlink, so /proc/self/exe
// would name the base interpreter instead). "" when the process is not
// Python.
func interpreterPrefix() string {
	if len(os.Args) == 0 || !strings.HasPrefix(filepath.Base(os.Args[0]), "python") ||
		!strings.ContainsRune(os.Args[0], filepath.Separator) { // a bare name came from $PATH: covered there
		return ""
	}
	exe, err := filepath.Abs(os.Args[0])
	if err != nil {
		return ""
	}
	return filepath.Dir(filepath.Dir(exe))
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

func samePath(a, b string) bool {
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	return errA == nil && errB == nil && ra == rb
}

// ucxEnvDefaults keep UCX away from the signals the Go runtime owns (SIGSEGV
// and friends): with error handling on, UCX installs its own handlers and
// even overrides sigaction, breaking Go's nil-pointer panics and preemption.
var ucxEnvDefaults = [][2]string{
	{"UCX_HANDLE_ERRORS", "none"},
	{"UCX_ERROR_SIGNALS", ""},
	// vLLM sets this before importing nixl to avoid a UCX registration-cache leak.
	{"UCX_RCACHE_MAX_UNRELEASED", "1024"},
}

// prepareUCXEnv sets each UCX default unless the user set it. With cgo,
// os.Setenv also updates the C environment that UCX reads.
func prepareUCXEnv() {
	for _, kv := range ucxEnvDefaults {
		if _, set := os.LookupEnv(kv[0]); !set {
			_ = os.Setenv(kv[0], kv[1])
		}
	}
}
