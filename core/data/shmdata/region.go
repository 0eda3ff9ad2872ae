package shmdata

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapping is one line of /proc/self/maps.
type mapping struct {
	start, end uint64
	shared     bool
	offset     uint64
	devMajor   uint32
	devMinor   uint32
	inode      uint64
	path       string
}

// regionFile is the file behind the host's region: our own O_RDWR fd for
// it and where in it the region starts.
type regionFile struct {
	fd     int
	offset uint64
}

// errAnonymous explains why anonymous memory cannot be granted: no fd
// names it, so there is nothing to hand a peer.
var errAnonymous = errors.New("the region is anonymous memory: the same-host path needs a file-backed region " +
	"(vLLM's /dev/shm region is)")

// findRegionFile finds the file mapped at mem and an fd for it.
func findRegionFile(mem []byte) (regionFile, error) {
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	end := base + uint64(len(mem))
	maps, err := readMaps(base, end)
	if err != nil {
		return regionFile{}, err
	}
	first := maps[0]
	if first.inode == 0 || first.path == "/dev/zero (deleted)" || strings.HasPrefix(first.path, "[") {
		return regionFile{}, errAnonymous
	}
	for i, m := range maps {
		if m.inode != first.inode || m.devMajor != first.devMajor || m.devMinor != first.devMinor {
			return regionFile{}, errors.New("the region spans several mappings of different files")
		}
		if !m.shared {
			return regionFile{}, fmt.Errorf("the region is a private (copy-on-write) mapping of %s: "+
				"the same-host path needs it mapped MAP_SHARED", first.path)
		}
		if i > 0 && m.offset != maps[i-1].offset+(maps[i-1].end-maps[i-1].start) {
			return regionFile{}, fmt.Errorf("the region maps %s at discontiguous file offsets", first.path)
		}
	}
	fd, err := openMatching(first)
	if err != nil {
		return regionFile{}, err
	}
	if err := memoryBacked(fd); err != nil {
		_ = unix.Close(fd)
		return regionFile{}, fmt.Errorf("the region maps %s: %w", first.path, err)
	}
	return regionFile{fd: fd, offset: first.offset + (base - first.start)}, nil
}

// memoryBacked refuses files that are not in memory: a page fault on a disk,
// FUSE or network file can block a copy in the kernel for as long as that
// filesystem likes, past every deadline. hugetlbfs is in memory but maps
// only at huge-page offsets, and a producer maps the granted rows from the
// base page that holds the first.
func memoryBacked(fd int) error {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return fmt.Errorf("fstatfs: %w", err)
	}
	switch fs.Type {
	case unix.TMPFS_MAGIC:
		return nil
	case unix.HUGETLBFS_MAGIC:
		return errors.New("it is on hugetlbfs, which maps only at huge-page offsets: the same-host path serves tmpfs " +
			"(such as /dev/shm, vLLM's) and memfd regions")
	}
	return fmt.Errorf("it is not in memory (filesystem type %#x): the same-host path serves tmpfs "+
		"(such as /dev/shm, vLLM's) and memfd regions", fs.Type)
}

// readMaps returns the contiguous mappings that cover [base, end).
func readMaps(base, end uint64) ([]mapping, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, fmt.Errorf("cannot read the process's mappings: %w", err)
	}
	defer f.Close()
	var covering []mapping
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		m, err := parseMapsLine(sc.Text())
		if err != nil {
			return nil, err
		}
		if m.end <= base || m.start >= end {
			continue
		}
		if len(covering) == 0 && m.start > base {
			break
		}
		if n := len(covering); n > 0 && covering[n-1].end != m.start {
			break
		}
		covering = append(covering, m)
		if m.end >= end {
			return covering, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the process's mappings: %w", err)
	}
	return nil, errors.New("the region is not wholly mapped")
}

// parseMapsLine reads "start-end perms offset major:minor inode   path".
func parseMapsLine(line string) (mapping, error) {
	bad := fmt.Errorf("unexpected /proc/self/maps line %q", line)
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return mapping{}, bad
	}
	addrs := strings.SplitN(fields[0], "-", 2)
	devs := strings.SplitN(fields[3], ":", 2)
	if len(addrs) != 2 || len(devs) != 2 || len(fields[1]) != 4 {
		return mapping{}, bad
	}
	var m mapping
	var errs [6]error
	m.start, errs[0] = strconv.ParseUint(addrs[0], 16, 64)
	m.end, errs[1] = strconv.ParseUint(addrs[1], 16, 64)
	m.offset, errs[2] = strconv.ParseUint(fields[2], 16, 64)
	major, err3 := strconv.ParseUint(devs[0], 16, 32)
	minor, err4 := strconv.ParseUint(devs[1], 16, 32)
	errs[3], errs[4] = err3, err4
	m.inode, errs[5] = strconv.ParseUint(fields[4], 10, 64)
	if errors.Join(errs[:]...) != nil {
		return mapping{}, bad
	}
	m.devMajor, m.devMinor = uint32(major), uint32(minor)
	m.shared = fields[1][3] == 's'
	m.path = afterFields(line, 5)
	return m, nil
}

// afterFields is what follows the first n space-separated fields: the
// path, which may itself hold spaces.
func afterFields(line string, n int) string {
	rest := line
	for range n {
		rest = strings.TrimLeft(rest, " ")
		i := strings.IndexByte(rest, ' ')
		if i < 0 {
			return ""
		}
		rest = rest[i:]
	}
	return strings.TrimLeft(rest, " ")
}

// openMatching returns a new O_RDWR fd for m's file: through an fd the
// host keeps open (works for memfds and deleted files), else by its path.
// Either way the file's device and inode must be m's.
func openMatching(m mapping) (int, error) {
	if fd, ok := reopenOpenFd(m); ok {
		return fd, nil
	}
	if strings.HasPrefix(m.path, "/") && !strings.HasSuffix(m.path, " (deleted)") {
		fd, err := openChecked(m.path, m)
		if err == nil {
			return fd, nil
		}
		return -1, fmt.Errorf("the region's file %s cannot be opened for writing: %w", m.path, err)
	}
	return -1, fmt.Errorf("no file descriptor for the region's file %s: keep it open (a memfd or a deleted file "+
		"has no other name)", m.path)
}

// reopenOpenFd scans our fds for one on m's file and reopens it read-write
// through /proc, so the grant does not depend on the host's fd staying
// open or having been opened for writing.
func reopenOpenFd(m mapping) (int, bool) {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1, false
	}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(n, &st) != nil || !sameFile(&st, m) {
			continue
		}
		if fd, err := openChecked("/proc/self/fd/"+e.Name(), m); err == nil {
			return fd, true
		}
	}
	return -1, false
}

// openChecked opens path read-write and keeps it only if it is m's file.
func openChecked(path string, m mapping) (int, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	if !sameFile(&st, m) || st.Mode&unix.S_IFMT != unix.S_IFREG {
		_ = unix.Close(fd)
		return -1, errors.New("it is no longer the mapped file")
	}
	return fd, nil
}

func sameFile(st *unix.Stat_t, m mapping) bool {
	dev := uint64(st.Dev) // Dev is uint32 on some architectures
	return st.Ino == m.inode && unix.Major(dev) == m.devMajor && unix.Minor(dev) == m.devMinor
}
