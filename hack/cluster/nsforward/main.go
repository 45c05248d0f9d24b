// Command nsforward forwards TCP ports of this machine's loopback into a network namespace:
// the real cluster's API server listens on the node's address inside the namespace the
// cluster script made, and the host's kubectl and helm reach it through 127.0.0.1. Each
// connection is dialled from a thread that entered the namespace (and is discarded after).
// It exits when the process owning the namespace is gone.
//
//	nsforward -pid <holder> -forward 127.0.0.1:16443=10.250.0.1:6443 [-forward ...]
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

type forwards []string

func (f *forwards) String() string     { return strings.Join(*f, ",") }
func (f *forwards) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	pid := flag.Int("pid", 0, "a process in the network namespace to forward into")
	var fw forwards
	flag.Var(&fw, "forward", "<listen host:port>=<target host:port in the namespace> (repeatable)")
	flag.Parse()
	if *pid <= 0 || len(fw) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	ns := fmt.Sprintf("/proc/%d/ns/net", *pid)
	if _, err := os.Stat(ns); err != nil {
		log.Fatal(err)
	}
	for _, f := range fw {
		listen, target, ok := strings.Cut(f, "=")
		if !ok {
			log.Fatalf("-forward %q: want listen=target", f)
		}
		l, err := net.Listen("tcp", listen)
		if err != nil {
			log.Fatal(err)
		}
		go serve(l, ns, target)
	}
	for {
		time.Sleep(time.Second)
		if _, err := os.Stat(ns); err != nil {
			return // the namespace's owner is gone: so is the cluster
		}
	}
}

func serve(l net.Listener, ns, target string) {
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			defer c.Close()
			t, err := dialIn(ns, target)
			if err != nil {
				log.Printf("dial %s in %s: %v", target, ns, err)
				return
			}
			defer t.Close()
			var wg sync.WaitGroup
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			go pipe(t, c)
			go pipe(c, t)
			wg.Wait()
		}()
	}
}

// dialIn connects to addr from inside the network namespace ns. The dialling goroutine
// stays locked to its thread, which Go then discards, so no other goroutine ever runs in
// the namespace.
func dialIn(ns, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(ns)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: errors.Join(errors.New("setns"), err)}
			return
		}
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}
