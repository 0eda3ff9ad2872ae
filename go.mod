module github.com/peerkv/peerkv

go 1.26

require (
	github.com/NVIDIA/go-nvml v0.13.4-1 // indirect
	github.com/pebbe/zmq4 v1.4.0 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	github.com/ugorji/go/codec v1.3.2 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
