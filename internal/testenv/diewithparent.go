package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The control plane's kube-apiserver and etcd are started by envtest, which gives them their
// own process group and has no hook for a parent-death signal, so a program killed with
// SIGKILL (a test binary at its timeout, `make demo` under kill -9) would leave them running.
// So StartControlPlane starts them through the running executable instead: envtest runs a
// symbolic link named kube-apiserver (or etcd) that points at this program, whose init (below,
// in every binary that imports this package) asks the kernel for SIGKILL when the parent
// dies and then executes the real binary in place: same process, same arguments.
const (
	wrapAssetsEnv = "WEBHOOK_OPERATOR_CONTROL_PLANE_ASSETS"
	wrapParentEnv = "WEBHOOK_OPERATOR_CONTROL_PLANE_PARENT"
)

func init() { execWrappedBinary() }

// wrappedBinaries are the control plane's long-running processes.
var wrappedBinaries = []string{"kube-apiserver", "etcd"}

// execWrappedBinary returns at once unless this process was started as a wrapped
// kube-apiserver or etcd; then it never returns: it executes the real binary, which the
// kernel kills when the process that started the control plane dies.
func execWrappedBinary() {
	assets := os.Getenv(wrapAssetsEnv)
	name := filepath.Base(os.Args[0])
	if assets == "" || !slices.Contains(wrappedBinaries, name) {
		return
	}
	// The parent-death signal belongs to the thread that executes the binary: keep one.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "%s: setting the parent-death signal: %v\n", name, err)
		os.Exit(1)
	}
	// The parent may have died between starting this process and the line above.
	if strconv.Itoa(os.Getppid()) != os.Getenv(wrapParentEnv) {
		fmt.Fprintf(os.Stderr, "%s: the process that started it is gone\n", name)
		os.Exit(1)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, wrapAssetsEnv+"=") || strings.HasPrefix(kv, wrapParentEnv+"=")
	})
	err := unix.Exec(filepath.Join(assets, name), os.Args, env)
	fmt.Fprintf(os.Stderr, "%s: executing %s: %v\n", name, filepath.Join(assets, name), err)
	os.Exit(127)
}

// wrapAssets makes dir a view of the control-plane assets in which kube-apiserver and etcd
// are this executable (see execWrappedBinary) and every other file is the real
// one, and sets the environment that the wrapped binaries read.
func wrapAssets(dir, assets string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if assets, err = filepath.Abs(assets); err != nil {
		return err
	}
	entries, err := os.ReadDir(assets)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		target := filepath.Join(assets, e.Name())
		if slices.Contains(wrappedBinaries, e.Name()) {
			target = self
		}
		link := filepath.Join(dir, e.Name())
		_ = os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			return err
		}
	}
	// Children inherit these: envtest starts the control plane with this process's
	// environment. Only a process named kube-apiserver or etcd acts on them.
	if err := os.Setenv(wrapAssetsEnv, assets); err != nil {
		return err
	}
	return os.Setenv(wrapParentEnv, strconv.Itoa(os.Getpid()))
}
