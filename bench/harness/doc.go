// Package harness is `make bench`: it measures webhook-operator's dispatcher against real
// parts and writes the figures to bench/results/.
//
// Every run starts its own world: an envtest control plane (kube-apiserver and etcd, for the
// WebhookEndpoint objects the dispatcher watches), a nats-server with JetStream and file
// storage in its own process, and HTTP receivers on loopback in the harness process. Each
// dispatcher under test is dispatcher.Run in a child process of the harness binary (the same
// code as `webhook-operator dispatcher`, started with the same defaults), so its CPU time and
// memory are its own and can be profiled alone. The baselines (a plain HTTP client, a raw
// JetStream consume-and-ack loop, a naive consume→POST→ack loop) also run as child processes,
// so every client under comparison pays the same process boundaries.
//
// The harness plays the controller: it creates the namespace, the signing Secrets, the
// WebhookEndpoints and RetryPolicies, and the durable consumers exactly as the controller
// does (each endpoint's consumers on the events and deliveries streams).
//
// Scenarios (each bounded in time and count, each stopping by itself): throughput, latency,
// isolation, backlog, scale, recovery. See Options for the counts and the -quick sizes.
package harness
