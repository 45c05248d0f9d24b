// Command pause is the real cluster's sandbox (pause) container: it holds a pod's namespaces,
// reaps the zombies it inherits as the pod's PID 1 and exits on SIGTERM or SIGINT, as
// Kubernetes' own pause does. containerd's sandbox_image names its image, packed locally.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
