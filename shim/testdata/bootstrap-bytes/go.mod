module bootstrap-bytes

go 1.24

require (
	github.com/containerd/containerd/api v1.11.1
	github.com/containerd/containerd/v2 v2.3.7
	github.com/containerd/log v0.1.0
	github.com/containerd/typeurl/v2 v2.2.3
)
