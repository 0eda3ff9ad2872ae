module github.com/peerkv/peerkv

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/elastic/go-seccomp-bpf v1.6.0
	github.com/pebbe/zmq4 v1.4.0
	github.com/stretchr/testify v1.12.1
	github.com/ugorji/go/codec v1.3.2
	golang.org/x/sys v0.50.0
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.41.0 // indirect
)
