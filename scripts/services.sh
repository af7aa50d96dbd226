#!/usr/bin/env bash
# Starts PostgreSQL and Redis on 127.0.0.1 when they are not answering (tests need both).
# On machines where they already run this does nothing.
set -uo pipefail

if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  if command -v redis-server >/dev/null; then
    echo "services: starting redis" >&2
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
  else
    echo "services: redis-server is not installed (apt-get install redis-server)" >&2
  fi
fi

if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null; then
    echo "services: starting postgresql" >&2
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  else
    echo "services: PostgreSQL is not installed (apt-get install postgresql)" >&2
  fi
fi

for _ in $(seq 1 30); do
  if (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
    exit 0
  fi
  sleep 1
done
echo "services: redis or postgresql did not come up; tests that need them will fail" >&2
exit 0
