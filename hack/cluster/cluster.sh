#!/usr/bin/env bash
# A real single-node Kubernetes on this machine, inside namespaces this script makes and
# removes: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd + runc,
# kubelet, kube-proxy (nftables) and CoreDNS, with the bridge CNI. Nothing on the host
# changes: no sysctl (the values kubelet wants are bind-mounted over /proc/sys inside the
# private mount namespace), no mount, interface or nftables rule outside the namespaces; the
# cgroups kubelet makes (kubepods) are removed on `down`. See docs/real-cluster.md.
#
#   hack/cluster/cluster.sh up       start it (images from $CLUSTER_IMAGES, binaries from bin/)
#   hack/cluster/cluster.sh down     stop it and remove every trace
#   hack/cluster/cluster.sh env      the KUBECONFIG line for a shell
#   hack/cluster/cluster.sh load <image.tar>...   import images into the node's containerd
#   hack/cluster/cluster.sh status   exit 0 when a cluster is running
#   hack/cluster/cluster.sh exec <cmd>...         run a command inside the node's namespaces
#
# Needs root and Linux with cgroups; the Debian parts come from hack/cluster/packages.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${BIN:-${ROOT}/bin}"
DIR="${CLUSTER_DIR:-/var/tmp/webhook-operator-cluster}"
IMAGES="${CLUSTER_IMAGES:-${BIN}/images}"
HOST_API="${CLUSTER_API_ADDRESS:-127.0.0.1:16443}"

NODE_NAME="${CLUSTER_NODE_NAME:-webhook-operator-node}"
NODE_IP=10.250.0.1
NODE_PEER_IP=10.250.0.2
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SVC_IP=10.96.0.1
DNS_SVC_IP=10.96.0.10
CLUSTER_DOMAIN=cluster.local
KUBE_VERSION="$(cat "${BIN}/node/kubelet.version" 2>/dev/null | sed 's/+.*//' || true)"

# The images the node itself needs (packed by `make cluster-images`).
PAUSE_IMAGE=localhost/cluster/pause:v1
COREDNS_IMAGE="localhost/cluster/coredns:$(cat "${BIN}/coredns.version" 2>/dev/null || echo unknown)"

PKI="${DIR}/pki"
LOGS="${DIR}/logs"
PIDS="${DIR}/pids"
HOLDER_PID_FILE="${PIDS}/holder"
# Directories of the host that libcni and containerd use whatever their configuration says,
# which this script creates (if missing) for the cluster's lifetime and removes again.
HOST_DIRS=(/var/lib/cni)

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'cluster: %s\n' "$*" >&2; exit 1; }

holder_pid() { [[ -f ${HOLDER_PID_FILE} ]] && cat "${HOLDER_PID_FILE}"; }
running() {
  local p
  p="$(holder_pid 2>/dev/null)" || return 1
  [[ -n ${p} && -e /proc/${p}/ns/net && "$(cat /proc/${p}/comm 2>/dev/null)" == sleep ]]
}
# inside: run a command in the node's mount and network namespaces.
inside() { nsenter -t "$(holder_pid)" -m -n -- "$@"; }

kubectl_admin() { inside "${BIN}/k8s/kubectl" --kubeconfig "${DIR}/admin.kubeconfig" "$@"; }

# wait_for <what> <seconds> <command...>: poll until the command succeeds.
wait_for() {
  local what="$1" secs="$2"
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      echo "cluster: timed out after ${secs}s waiting for ${what}; logs in ${LOGS}" >&2
      return 1
    fi
    sleep 0.5
  done
}

# start <name> <command...>: a daemon inside the namespaces, its log in logs/<name>.log.
start() {
  local name="$1"
  shift
  setsid nsenter -t "$(holder_pid)" -m -n -- "$@" >"${LOGS}/${name}.log" 2>&1 </dev/null &
  echo $! >"${PIDS}/${name}"
}

alive() { [[ -f ${PIDS}/$1 ]] && kill -0 "$(cat "${PIDS}/$1")" 2>/dev/null; }

# --- PKI --------------------------------------------------------------------------------

# cert <name> <CN> <O or -> <extensions or ->: a key and a certificate signed by the CA.
cert() {
  local name="$1" cn="$2" org="$3" ext="$4" ca="${5:-ca}" subj="/CN=$2"
  [[ ${org} == - ]] || subj="/O=${org}/CN=${cn}"
  openssl genrsa -out "${PKI}/${name}.key" 2048 2>/dev/null
  openssl req -new -key "${PKI}/${name}.key" -subj "${subj}" -out "${PKI}/${name}.csr" 2>/dev/null
  local extfile="${PKI}/${name}.ext"
  if [[ ${ext} == - ]]; then
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"${extfile}"
  else
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n%s\n' "${ext}" >"${extfile}"
  fi
  openssl x509 -req -in "${PKI}/${name}.csr" -CA "${PKI}/${ca}.crt" -CAkey "${PKI}/${ca}.key" \
    -CAcreateserial -days 30 -sha256 -extfile "${extfile}" -out "${PKI}/${name}.crt" 2>/dev/null
  rm -f "${PKI}/${name}.csr" "${extfile}"
}

ca() {
  openssl genrsa -out "${PKI}/$1.key" 2048 2>/dev/null
  openssl req -x509 -new -key "${PKI}/$1.key" -subj "/CN=$2" -days 30 -sha256 \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -out "${PKI}/$1.crt" 2>/dev/null
}

# kubeconfig <file> <cert name> <server>
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ${NODE_NAME}
  cluster:
    server: $3
    certificate-authority: ${PKI}/ca.crt
users:
- name: $2
  user:
    client-certificate: ${PKI}/$2.crt
    client-key: ${PKI}/$2.key
contexts:
- name: $2@${NODE_NAME}
  context: {cluster: ${NODE_NAME}, user: $2}
current-context: $2@${NODE_NAME}
EOF
}

make_pki() {
  mkdir -p "${PKI}"
  ca ca "webhook-operator-cluster-ca"
  ca front-proxy-ca "webhook-operator-cluster-front-proxy-ca"
  local host="${HOST_API%:*}"
  cert apiserver kube-apiserver - "extendedKeyUsage=serverAuth
subjectAltName=IP:${NODE_IP},IP:${KUBERNETES_SVC_IP},IP:127.0.0.1,IP:${host},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.${CLUSTER_DOMAIN}"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters -
  cert front-proxy-client front-proxy-client - - front-proxy-ca
  cert admin kubernetes-admin system:masters -
  cert kubelet "system:node:${NODE_NAME}" system:nodes -
  cert kubelet-serving "system:node:${NODE_NAME}" system:nodes "extendedKeyUsage=serverAuth
subjectAltName=IP:${NODE_IP},DNS:${NODE_NAME}"
  cert controller-manager system:kube-controller-manager - -
  cert scheduler system:kube-scheduler - -
  cert kube-proxy system:kube-proxy - -
  openssl genrsa -out "${PKI}/sa.key" 2048 2>/dev/null
  openssl rsa -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
  local url="https://${NODE_IP}:6443"
  kubeconfig "${DIR}/admin.kubeconfig" admin "${url}"
  kubeconfig "${DIR}/kubelet.kubeconfig" kubelet "${url}"
  kubeconfig "${DIR}/controller-manager.kubeconfig" controller-manager "${url}"
  kubeconfig "${DIR}/scheduler.kubeconfig" scheduler "${url}"
  kubeconfig "${DIR}/kube-proxy.kubeconfig" kube-proxy "${url}"
  # The host's: through the forwarder on the host's loopback.
  kubeconfig "${DIR}/kubeconfig" admin "https://${HOST_API}"
  chmod 600 "${PKI}"/*.key
}

# --- configuration files ------------------------------------------------------------------

write_configs() {
  mkdir -p "${DIR}/cni/net.d" "${DIR}/containerd" "${DIR}/kubelet" "${DIR}/var-log" "${DIR}/sysctl" "${DIR}/etcd"
  cat >"${DIR}/cni/net.d/10-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "${DIR}/cni/ipam",
        "ranges": [[{"subnet": "${POD_CIDR}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
  cat >"${DIR}/containerd/config.toml" <<EOF
version = 2
root = "${DIR}/containerd/root"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "${DIR}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  # This machine's root lacks CAP_SYS_RESOURCE: oom_score_adj can only be raised, and
  # containerd would ask for -998 for the sandbox (runc then fails every sandbox).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "${DIR}/cni/net.d"
EOF
  printf 'nameserver %s\nsearch %s\n' "${DNS_SVC_IP}" "${CLUSTER_DOMAIN}" >"${DIR}/resolv.conf"
  cat >"${DIR}/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${PKI}/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: ${PKI}/kubelet-serving.crt
tlsPrivateKeyFile: ${PKI}/kubelet-serving.key
address: ${NODE_IP}
healthzBindAddress: 127.0.0.1
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# The sysctls kubelet wants are bind-mounted inside the node's mount namespace: it only
# reads them, and the host's stay as they are.
protectKernelDefaults: true
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
clusterDNS: [${DNS_SVC_IP}]
clusterDomain: ${CLUSTER_DOMAIN}
resolvConf: ${DIR}/resolv.conf
podLogsDir: ${DIR}/pod-logs
volumePluginDir: ${DIR}/kubelet/volume-plugins
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
maxPods: 110
EOF
  cat >"${DIR}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: ${DIR}/kube-proxy.kubeconfig}
hostnameOverride: ${NODE_NAME}
clusterCIDR: ${POD_CIDR}
conntrack: {maxPerCore: 0}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
EOF
}

# The values kubelet checks (protectKernelDefaults) and the entries they live in.
SYSCTLS=(vm/overcommit_memory=1 kernel/panic=10 kernel/panic_on_oops=1 vm/panic_on_oom=0
  kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000)

# --- namespaces -----------------------------------------------------------------------------

# own_namespaces <pid>: the process runs in a network namespace other than ours.
own_namespaces() { [[ "$(readlink "/proc/$1/ns/net" 2>/dev/null)" != "$(readlink /proc/$$/ns/net)" ]] && [[ -e /proc/$1/ns/net ]]; }

make_namespaces() {
  setsid unshare --mount --net --propagation private sleep infinity </dev/null >/dev/null 2>&1 &
  echo $! >"${HOLDER_PID_FILE}"
  wait_for "the namespace holder" 10 own_namespaces "$!"
  for d in "${HOST_DIRS[@]}"; do
    if [[ ! -e ${d} ]]; then
      mkdir -p "${d}"
      echo "${d}" >>"${DIR}/created-host-dirs"
    fi
  done
  local binds=""
  for s in "${SYSCTLS[@]}"; do
    local key="${s%%=*}" want="${s#*=}"
    if [[ "$(cat "/proc/sys/${key}")" != "${want}" ]]; then
      local f="${DIR}/sysctl/${key//\//.}"
      echo "${want}" >"${f}"
      binds+="mount --bind ${f} /proc/sys/${key}; "
    fi
  done
  inside bash -euc "
    mount --make-rshared /
    mount -t tmpfs -o mode=755 tmpfs /run
    mount --bind '${DIR}/var-log' /var/log
    ${binds}
    ip link set lo up
    ip link add node0 type veth peer name node0-peer
    ip addr add ${NODE_IP}/24 dev node0
    ip link set node0 up
    ip link set node0-peer up
    ip route add ${SERVICE_CIDR} dev node0
    sysctl -qw net.ipv4.ip_forward=1
  "
}

# --- up -------------------------------------------------------------------------------------

up() {
  [[ $(id -u) == 0 ]] || die "needs root (it makes namespaces, runs containerd and kubelet)"
  if running; then
    die "a cluster is already running (${DIR}); stop it with 'make cluster-down'"
  fi
  "${ROOT}/hack/cluster/packages.sh"
  local b
  for b in k8s/etcd k8s/kube-apiserver k8s/kubectl node/kubelet node/kube-controller-manager node/kube-scheduler node/kube-proxy nsforward; do
    [[ -x ${BIN}/${b} ]] || die "${BIN}/${b} is missing: make cluster builds it"
  done
  for b in pause coredns; do
    [[ -f ${IMAGES}/${b}.tar ]] || die "${IMAGES}/${b}.tar is missing: make cluster-images packs it"
  done
  # Whatever a killed run left behind.
  down_quiet
  local t0=${SECONDS}
  mkdir -p "${DIR}" "${LOGS}" "${PIDS}"
  log "starting a Kubernetes ${KUBE_VERSION} node in ${DIR}"
  make_pki
  write_configs
  make_namespaces

  start etcd "${BIN}/k8s/etcd" --data-dir "${DIR}/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster default=http://127.0.0.1:2380 \
    --unsafe-no-fsync --quota-backend-bytes 4294967296
  start kube-apiserver "${BIN}/k8s/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
    --bind-address 0.0.0.0 --secure-port 6443 --advertise-address "${NODE_IP}" \
    --service-cluster-ip-range "${SERVICE_CIDR}" \
    --client-ca-file "${PKI}/ca.crt" --tls-cert-file "${PKI}/apiserver.crt" --tls-private-key-file "${PKI}/apiserver.key" \
    --kubelet-client-certificate "${PKI}/apiserver-kubelet-client.crt" --kubelet-client-key "${PKI}/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer "https://kubernetes.default.svc.${CLUSTER_DOMAIN}" \
    --service-account-key-file "${PKI}/sa.pub" --service-account-signing-key-file "${PKI}/sa.key" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --enable-aggregator-routing=true \
    --requestheader-client-ca-file "${PKI}/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "${PKI}/front-proxy-client.crt" --proxy-client-key-file "${PKI}/front-proxy-client.key" \
    --allow-privileged=true
  # The forwarder listens on the host's loopback, so it runs outside the namespaces.
  setsid "${BIN}/nsforward" -pid "$(holder_pid)" -forward "${HOST_API}=${NODE_IP}:6443" >"${LOGS}/nsforward.log" 2>&1 </dev/null &
  echo $! >"${PIDS}/nsforward"
  wait_for "kube-apiserver" 180 inside curl -sf --cacert "${PKI}/ca.crt" --cert "${PKI}/admin.crt" --key "${PKI}/admin.key" "https://${NODE_IP}:6443/readyz"

  start kube-controller-manager "${BIN}/node/kube-controller-manager" --kubeconfig "${DIR}/controller-manager.kubeconfig" \
    --authentication-kubeconfig "${DIR}/controller-manager.kubeconfig" --authorization-kubeconfig "${DIR}/controller-manager.kubeconfig" \
    --leader-elect=false --use-service-account-credentials=true --bind-address 127.0.0.1 \
    --service-account-private-key-file "${PKI}/sa.key" --root-ca-file "${PKI}/ca.crt" \
    --cluster-signing-cert-file "${PKI}/ca.crt" --cluster-signing-key-file "${PKI}/ca.key" \
    --service-cluster-ip-range "${SERVICE_CIDR}"
  start kube-scheduler "${BIN}/node/kube-scheduler" --kubeconfig "${DIR}/scheduler.kubeconfig" \
    --authentication-kubeconfig "${DIR}/scheduler.kubeconfig" --authorization-kubeconfig "${DIR}/scheduler.kubeconfig" \
    --leader-elect=false --bind-address 127.0.0.1
  start containerd containerd --config "${DIR}/containerd/config.toml"
  wait_for "containerd" 60 inside ctr --address /run/containerd/containerd.sock version
  load "${IMAGES}/pause.tar" "${IMAGES}/coredns.tar"
  start kubelet "${BIN}/node/kubelet" --config "${DIR}/kubelet/config.yaml" --kubeconfig "${DIR}/kubelet.kubeconfig" \
    --root-dir "${DIR}/kubelet/root" --cert-dir "${DIR}/kubelet/pki" --node-ip "${NODE_IP}" \
    --hostname-override "${NODE_NAME}"
  start kube-proxy "${BIN}/node/kube-proxy" --config "${DIR}/kube-proxy.yaml"
  wait_for "the node to be Ready" 180 kubectl_admin wait --for=condition=Ready "node/${NODE_NAME}" --timeout=2s
  wait_for "the default ServiceAccount" 120 kubectl_admin get serviceaccount default -n default
  coredns
  wait_for "CoreDNS" 180 kubectl_admin -n kube-system wait --for=condition=Available deployment/coredns --timeout=2s
  log "node ${NODE_NAME} Ready with CoreDNS in $((SECONDS - t0))s"
  usage
}

coredns() {
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects:
- {kind: ServiceAccount, name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  # No forward: nothing outside the cluster can be reached from here.
  # Port 1053 (the Service maps 53 to it): CoreDNS runs as the image's nonroot user, without
  # NET_BIND_SERVICE.
  Corefile: |
    .:1053 {
        errors
        health {
            lameduck 5s
        }
        ready
        kubernetes ${CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        cache 30
        loop
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 1
  selector:
    matchLabels: {k8s-app: kube-dns}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      containers:
      - name: coredns
        image: ${COREDNS_IMAGE}
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {containerPort: 1053, name: dns, protocol: UDP}
        - {containerPort: 1053, name: dns-tcp, protocol: TCP}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {drop: [ALL]}
          readOnlyRootFilesystem: true
          runAsNonRoot: true
        resources:
          requests: {cpu: 50m, memory: 32Mi}
          limits: {memory: 170Mi}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
        livenessProbe:
          httpGet: {path: /health, port: 8080}
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
      volumes:
      - name: config
        configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: ${DNS_SVC_IP}
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, targetPort: 1053, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP}
EOF
}

usage() {
  cat <<EOF

A real Kubernetes node is running (stop it with: make cluster-down).
  export KUBECONFIG=${DIR}/kubeconfig
  ${BIN}/k8s/kubectl get nodes
  ${BIN}/helm install webhook-operator charts/webhook-operator --namespace webhook-operator-system --create-namespace ...
  make image        # packs bin/webhook-operator and loads it into the node (imagePullPolicy IfNotPresent)
Images are loaded with: hack/cluster/cluster.sh load <image.tar>
Logs: ${LOGS}; a shell in the node's namespaces: hack/cluster/cluster.sh exec bash
EOF
}

# load <tar>...: import image tarballs into the node's containerd (namespace k8s.io, where the
# CRI looks).
load() {
  running || die "no cluster is running (make cluster starts one)"
  local f
  for f in "$@"; do
    inside ctr --address /run/containerd/containerd.sock -n k8s.io images import --no-unpack=false "${f}" >/dev/null ||
      die "importing ${f} failed"
  done
}

# --- down -----------------------------------------------------------------------------------

# pids_in_mount_ns <holder>: every process sharing the holder's mount namespace.
pids_in_ns() {
  local want p
  want="$(readlink "/proc/$1/ns/mnt" 2>/dev/null)" || return 0
  for p in /proc/[0-9]*; do
    [[ "$(readlink "${p}/ns/mnt" 2>/dev/null)" == "${want}" ]] && echo "${p#/proc/}"
  done
  return 0
}

# The cgroups kubelet made (cgroupfs driver): kubepods in every hierarchy.
kubepods_cgroups() {
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d ${d} ]] && echo "${d}"
  done
  return 0
}

# kill_cgroup_procs: every process left in a kubepods cgroup (containers and their children).
kill_cgroup_procs() {
  local sig="$1" d
  for d in $(kubepods_cgroups); do
    find "${d}" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill "-${sig}" 2>/dev/null || true
  done
}

remove_cgroups() {
  local d
  for d in $(kubepods_cgroups); do
    # Children first; a freezer cgroup must be thawed before its (dead) tasks leave it.
    find "${d}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# ours <name>: the pid of a component this cluster started, if it is still that process (a
# pid file left by a killed run may name a reused pid).
ours() {
  local p
  [[ -f ${PIDS}/$1 ]] || return 1
  p="$(cat "${PIDS}/$1")"
  [[ -r /proc/${p}/cmdline ]] && tr '\0' ' ' <"/proc/${p}/cmdline" | grep -q -- "${2:-$1}" && echo "${p}"
}

down_quiet() {
  local h="" n p i
  running && h="$(holder_pid)"
  if p="$(ours nsforward)"; then kill -TERM "${p}" 2>/dev/null || true; fi
  if [[ -n ${h} ]]; then
    # The components first (kubelet before containerd, so it stops no container twice),
    # then whatever remains in the namespace: containerd, its shims, etcd.
    for n in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver containerd etcd; do
      if p="$(ours "${n}" "${DIR}")"; then kill -TERM "${p}" 2>/dev/null || true; fi
    done
    for i in $(seq 1 20); do
      local pids
      pids="$(pids_in_ns "${h}" | grep -vx "${h}" || true)"
      [[ -z ${pids} ]] && break
      ((i < 10)) || kill -KILL ${pids} 2>/dev/null || true
      sleep 0.5
    done
    # The containers are in their own mount namespaces, and in kubepods.
    kill_cgroup_procs KILL
    kill -KILL "${h}" 2>/dev/null || true
    wait_for "the namespace holder to exit" 10 test ! -e "/proc/${h}"
  fi
  kill_cgroup_procs KILL
  for i in $(seq 1 20); do
    remove_cgroups
    [[ -z "$(kubepods_cgroups)" ]] && break
    kill_cgroup_procs KILL
    sleep 0.5
  done
  [[ -z "$(kubepods_cgroups)" ]] || echo "cluster: could not remove the cgroups $(kubepods_cgroups | tr '\n' ' ')" >&2
  if [[ -f ${DIR}/created-host-dirs ]]; then
    while read -r d; do rm -rf "${d}"; done <"${DIR}/created-host-dirs"
  fi
  if [[ -d ${DIR} ]]; then
    # The mounts under DIR (overlay snapshots, kubelet volumes) were in the node's mount
    # namespace, gone with it; nothing is mounted on the host, so this removes files only.
    if grep -q " ${DIR}" /proc/self/mountinfo; then
      die "something is mounted under ${DIR} on the host: not removing it"
    fi
    if [[ -n ${CLUSTER_KEEP_LOGS:-} && -d ${LOGS} ]]; then
      mkdir -p "${CLUSTER_KEEP_LOGS}" && cp -r "${LOGS}/." "${CLUSTER_KEEP_LOGS}/" || true
    fi
    rm -rf "${DIR}"
  fi
}

down() {
  [[ $(id -u) == 0 ]] || die "needs root"
  local t0=${SECONDS}
  down_quiet
  log "cluster stopped and removed in $((SECONDS - t0))s"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export KUBECONFIG=${DIR}/kubeconfig" ;;
  load) shift; load "$@" ;;
  status) running ;;
  exec) shift; running || die "no cluster is running"; inside "$@" ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
