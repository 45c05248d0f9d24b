package localstack

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// The test binary doubles as the container the pod runner runs: `<test binary> fakepod ...`
// serves /readyz and /healthz on the addresses it is given and writes what it saw (arguments,
// environment, its identity, what it may read) to $HOME/report.json.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "fakepod":
			fakePod(os.Args[2:])
			return
		case "fakechild":
			// A grandchild that ignores SIGTERM: only the process group's SIGKILL ends it.
			signal.Ignore(syscall.SIGTERM)
			time.Sleep(10 * time.Minute)
			return
		}
	}
	os.Exit(m.Run())
}

// fakeReport is what a fake pod saw.
type fakeReport struct {
	PID         int
	Args        []string
	Env         []string
	User        string
	UserErr     string
	AllowedErr  string
	OtherErr    string
	SecretFile  string
	TokenFile   string
	ChildPID    int
	WorkingDir  string
	KubeconfigX string
}

func fakePod(args []string) {
	flags := map[string]string{}
	for _, a := range args {
		if k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok {
			flags[k] = v
		}
	}
	home := os.Getenv("HOME")
	rep := fakeReport{PID: os.Getpid(), Args: args, Env: os.Environ()}
	rep.WorkingDir, _ = os.Getwd()
	if f := flags["secret-file"]; f != "" {
		b, err := os.ReadFile(f)
		rep.SecretFile = string(b)
		if err != nil {
			rep.SecretFile = "error: " + err.Error()
		}
	}
	if f := flags["token-file"]; f != "" {
		b, err := os.ReadFile(f)
		rep.TokenFile = string(b)
		if err != nil {
			rep.TokenFile = "error: " + err.Error()
		}
	}
	if cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG")); err != nil {
		rep.UserErr = err.Error()
	} else if cs, err := kubernetes.NewForConfig(cfg); err != nil {
		rep.UserErr = err.Error()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			rep.UserErr = err.Error()
		} else {
			rep.User = ssr.Status.UserInfo.Username
		}
		ns := os.Getenv("POD_NAMESPACE")
		if _, err := cs.CoreV1().Secrets(ns).Get(ctx, "allowed", metav1.GetOptions{}); err != nil {
			rep.AllowedErr = err.Error()
		}
		if _, err := cs.CoreV1().Secrets(ns).Get(ctx, "other", metav1.GetOptions{}); err != nil {
			rep.OtherErr = fmt.Sprintf("forbidden=%v", apierrors.IsForbidden(err))
		}
		cancel()
	}
	if os.Getenv("FAKE_GRANDCHILD") != "" {
		c := exec.Command(os.Args[0], "fakechild")
		if err := c.Start(); err == nil {
			rep.ChildPID = c.Process.Pid
		}
	}
	b, _ := json.Marshal(rep)
	_ = os.WriteFile(filepath.Join(home, "report.json.tmp"), b, 0o600)
	_ = os.Rename(filepath.Join(home, "report.json.tmp"), filepath.Join(home, "report.json"))

	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if _, err := os.Stat(filepath.Join(home, "unready")); err == nil {
			http.Error(w, "unready", http.StatusServiceUnavailable)
		}
	})
	for _, name := range []string{"health-probe-bind-address", "metrics-bind-address"} {
		l, err := net.Listen("tcp", flags[name])
		if err != nil {
			fmt.Fprintf(os.Stderr, "fakepod: listening on --%s=%s: %v\n", name, flags[name], err)
			os.Exit(3)
		}
		go func() { _ = http.Serve(l, mux) }()
	}
	fmt.Println("fakepod: serving")
	if os.Getenv("FAKE_IGNORE_TERM") != "" {
		signal.Ignore(syscall.SIGTERM)
		select {}
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	<-term
	fmt.Println("fakepod: SIGTERM")
}

// readReport waits for the report of the pod's current process.
func readReport(t *testing.T, dir, ns, pod string, pid int) fakeReport {
	t.Helper()
	var rep fakeReport
	testenv.Eventually(t, 30*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(dir, "pods", ns, pod, "report.json"))
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &rep); err != nil {
			return err
		}
		if rep.PID != pid {
			return fmt.Errorf("report of process %d, not %d", rep.PID, pid)
		}
		return nil
	}, "")
	return rep
}
