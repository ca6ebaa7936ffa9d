#!/usr/bin/env bash
# Installs the Debian 12 packages ridgekv needs to build and test (idempotent).
set -euo pipefail
pkgs=(build-essential meson ninja-build pkg-config python3 python3-pip python3-jinja2 xz-utils ca-certificates
      libcriterion-dev liburing-dev libzstd-dev libxxhash-dev libjson-c-dev libedit-dev libopenblas-dev
      libmicrohttpd-dev curl clang-format
      libpoppler-glib-dev libxml2-dev libzip-dev  # ask's PDF, HTML, EPUB and DOCX documents
      jargon-text)  # jargon-text: the calibration text of `ridgekv prepare` (public domain)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "deps: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The openai client that tests/cli/test_openai.py drives `serve --http` with (PyPI, per user;
# Debian 12 marks its Python as externally managed, hence --break-system-packages for --user).
if ! python3 -c "import openai" 2>/dev/null; then
  echo "deps: installing the openai Python package (pip --user)" >&2
  python3 -m pip install --user --quiet --break-system-packages openai ||
    echo "deps: pip install openai failed: tests/cli/test_openai.py will skip" >&2
fi
