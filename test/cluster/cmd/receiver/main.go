// Command receiver is the real cluster's webhook receiver pod: internal/testenv's Receiver
// (Standard Webhooks signatures verified with the standard's own Go library, receipts per
// event id) served over HTTPS on -listen with the certificate of its Service's DNS name, and
// a plain-HTTP control port the test reads through the API server's service proxy:
//
//	GET /receipts           the receiver's stats and receipts (JSON)
//	PUT /respond?status=N   answer every webhook with N from now on (200: accept again), and
//	                        with the body given as &body= (the console's test answers markup)
//	GET /healthz            ok
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

func main() {
	listen := flag.String("listen", ":8443", "HTTPS address of the webhooks")
	control := flag.String("control", ":8080", "plain-HTTP address of the control port")
	cert := flag.String("cert", "/tls/tls.crt", "serving certificate")
	key := flag.String("key", "/tls/tls.key", "serving key")
	secretFile := flag.String("secret-file", "/signing/secret", "the endpoint's signing secret (whsec_...), read again when a signature does not verify (the kubelet refreshes the mounted Secret)")
	flag.Parse()

	secrets := func(context.Context) ([]string, error) {
		b, err := os.ReadFile(*secretFile)
		if err != nil {
			return nil, err
		}
		return []string{strings.TrimSpace(string(b))}, nil
	}
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: secrets})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("GET /receipts", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Stats    testenv.ReceiverStats      `json:"stats"`
			Receipts map[string]testenv.Receipt `json:"receipts"`
		}{rcv.Stats(), rcv.Receipts()})
	})
	mux.HandleFunc("PUT /respond", func(w http.ResponseWriter, r *http.Request) {
		status, err := strconv.Atoi(r.URL.Query().Get("status"))
		if err != nil || status < 200 || status > 599 {
			http.Error(w, "want ?status=<200..599>", http.StatusBadRequest)
			return
		}
		body := r.URL.Query().Get("body")
		if body == "" {
			body = "answering " + strconv.Itoa(status) + " on purpose"
		}
		if len(body) > 4096 {
			http.Error(w, "the body is limited to 4096 bytes", http.StatusBadRequest)
			return
		}
		rcv.SetResponder(func(testenv.Request) testenv.Response {
			return testenv.Response{Status: status, Body: body}
		})
		log.Printf("answering %d from now on", status)
	})
	go func() {
		srv := &http.Server{Addr: *control, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		log.Fatal(srv.ListenAndServe())
	}()
	srv := &http.Server{Addr: *listen, Handler: rcv, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("receiving webhooks on https://%s/webhooks, control on http://%s", *listen, *control)
	log.Fatal(srv.ListenAndServeTLS(*cert, *key))
}
