# shellcheck shell=bash
# The Debian packages the servers come from (and debootstrap, which makes RabbitMQ 4's Debian 13
# root: rabbitmq4.sh). Sourced by scripts/services.sh.

# install_missing [demo]: with demo, only PostgreSQL and RabbitMQ.
install_missing() {
  local packages=()
  command -v pg_ctlcluster >/dev/null || packages+=(postgresql postgresql-client)
  command -v rabbitmq-server >/dev/null || [ -x /usr/sbin/rabbitmq-server ] || packages+=(rabbitmq-server)
  if [ "${1:-}" != demo ]; then
    command -v java >/dev/null || packages+=(openjdk-17-jre-headless)
    command -v curl >/dev/null || packages+=(curl)
    command -v openssl >/dev/null || packages+=(openssl)
    command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || packages+=(pgbouncer)
  fi
  [ ${#packages[@]} -eq 0 ] && return 0
  apt_install "${packages[@]}"
}

# apt_install PACKAGE...: installs them with apt when we are root, or says what to run.
apt_install() {
  if ! as_root true 2>/dev/null; then
    echo "missing: $*. Install with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y $*" >&2
    exit 1
  fi
  echo "installing $* with apt"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}
