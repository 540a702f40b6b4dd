# Sourced by the scripts that build Go modules (containerd-versions.sh, critest.sh), after
# they define die().
#
# find_go WHAT: prints the go command: $GO, else go in PATH, else the usual place of an
# upstream Go install; dies saying that WHAT needs Go when there is none.
find_go() {
    if [ -n "${GO:-}" ]; then
        command -v -- "$GO" >/dev/null || die "GO=$GO is not a command"
        echo "$GO"
    elif command -v go >/dev/null; then
        command -v go
    elif [ -x /usr/local/go/bin/go ]; then
        echo /usr/local/go/bin/go
    else
        die "go not found (in PATH or /usr/local/go/bin): $1"
    fi
}
