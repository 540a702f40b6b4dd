// Prints, in hex, the bytes containerd 2.3.7's own launch code (pkg/shim.Command) writes
// on a shim's stdin at start: the fixtures of shim/src/start.rs's tests. Run with
//
//	cd shim/testdata/bootstrap-bytes && GOFLAGS=-mod=mod go build -o /tmp/bootstrap-bytes . && /tmp/bootstrap-bytes
//
// (built to /tmp/golden23/gen for the fixtures: that path is the containerd_binary field).
package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
)

func dump(name, runtime string, opts bool, level log.Level, socketDir string) {
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	cfg := &shim.CommandConfig{
		ID:           "3f2a",
		RuntimePath:  runtime,
		GRPCAddress:  "/run/containerd/containerd.sock",
		TTRPCAddress: "/run/containerd/containerd.sock.ttrpc",
		WorkDir:      "/tmp",
		LogLevel:     level,
		Action:       "start",
		SocketDir:    socketDir,
	}
	if opts {
		a, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: "/etc/kata-containers/fast.toml"})
		if err != nil {
			panic(err)
		}
		cfg.Opts = a
	}
	cmd, err := shim.Command(ctx, cfg)
	if err != nil {
		panic(err)
	}
	b, _ := io.ReadAll(cmd.Stdin)
	fmt.Printf("%s %s\n", name, hex.EncodeToString(b))
}

func main() {
	kata := "/usr/local/bin/containerd-shim-kata-v2"
	dump("bootstrap_plain", kata, false, log.InfoLevel, "")
	dump("bootstrap_options_debug_socketdir", kata, true, log.DebugLevel, "/run/containerd/s")
	// containerd before 2.3 wrote the runtime options alone, as 2.3 still does for v1 shims.
	dump("legacy_options", "/usr/local/bin/containerd-shim-runc-v1", true, log.InfoLevel, "")
}
