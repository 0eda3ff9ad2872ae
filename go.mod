module github.com/peerkv/peerkv

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/elastic/go-seccomp-bpf v1.6.0
	github.com/pebbe/zmq4 v1.4.0
	github.com/stretchr/testify v1.12.1
	github.com/ugorji/go/codec v1.3.2
	github.com/zeebo/xxh3 v1.1.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/klauspost/cpuid/v2 v2.2.10 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.41.0 // indirect
)
