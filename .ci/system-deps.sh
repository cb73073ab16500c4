#!/bin/sh
# Make sure the system pieces the project runs on exist:
#   - PostgreSQL server binaries (initdb, pg_ctl), for the private cluster;
#   - a Java 17+ runtime, for Spark.
# As root on Debian/Ubuntu they are installed from the distribution's packages;
# anywhere else a missing piece stops here with a message saying what to install.
set -eu

have_pg_bins() {
    command -v initdb >/dev/null 2>&1 && return 0
    if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then return 0; fi
    for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && return 0; done
    return 1
}

have_java() { command -v java >/dev/null 2>&1; }

can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

# Optional: Debian's docker-compose (v1) validates docker-compose.yml offline in a
# test. Installed when we can; its test skips, saying why, when it cannot be had.
install_compose() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null 2>&1; }
if ! command -v docker-compose >/dev/null 2>&1 && can_apt; then
    echo "installing from Debian packages: docker-compose (optional, for the compose test)"
    install_compose || { apt-get update -qq && install_compose; } \
        || echo "docker-compose could not be installed; the compose test will skip" >&2
fi

# Optional: Debian's chromium, for the support page's headless-browser test
# (tests/api/test_browser.py, driven by Playwright; Playwright never downloads a
# browser here). Installed when we can; the test skips, saying why, when it cannot.
install_chromium() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }
if [ ! -x /usr/bin/chromium ] && can_apt; then
    echo "installing from Debian packages: chromium (optional, for the browser test)"
    install_chromium || { apt-get update -qq && install_chromium; } \
        || echo "chromium could not be installed; the browser test will skip" >&2
fi

missing=""
have_pg_bins || missing="$missing postgresql"
have_java || missing="$missing openjdk-17-jre-headless"

[ -n "$missing" ] || exit 0
if can_apt; then
    echo "installing from Debian packages:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
else
    echo "missing:$missing" >&2
    echo "Install them with your package manager (Debian/Ubuntu: apt-get install$missing;" >&2
    echo "macOS: brew install postgresql@15 openjdk@17)." >&2
    exit 1
fi
