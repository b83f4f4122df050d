#!/bin/sh
# Installs the Debian packages of the commands missing from PATH, with apt-get (through sudo when
# not root): the Makefile's run-packages and test-packages.
#
#   scripts/system-packages.sh [--optional] WHAT COMMAND=PACKAGE...
#
# WHAT names what needs them, in the messages. When a package cannot be installed (no apt-get here,
# not root and no sudo, or apt-get failed) it prints one line saying what to install and exits 1;
# with --optional it exits 0 after that line (make run: a Redis that already answers will do).
# APT_GET names the apt-get to use (default: apt-get on PATH).
set -u
optional=0
if [ "${1:-}" = --optional ]; then optional=1; shift; fi
what=$1
shift
commands= packages=
for pair in "$@"; do
  command -v "${pair%%=*}" >/dev/null 2>&1 && continue
  commands="$commands ${pair%%=*}"
  packages="$packages ${pair#*=}"
done
[ -z "$packages" ] && exit 0

give_up() {
  echo "$what needs$commands, which $1: install$packages (Debian's package names) or your system's equivalent" >&2
  [ "$optional" = 1 ] && exit 0
  exit 1
}

apt=${APT_GET:-apt-get}
command -v "$apt" >/dev/null 2>&1 || give_up "this system has no apt-get to install"
if [ "$(id -u)" = 0 ]; then
  sudo=
elif command -v sudo >/dev/null 2>&1; then
  sudo=sudo
else
  give_up "cannot be installed without root (no sudo)"
fi
echo "installing$packages (Debian packages${sudo:+, with sudo})"
# shellcheck disable=SC2086 # one word per package
{ $sudo "$apt" update -qq && $sudo "$apt" install -y -qq --no-install-recommends $packages; } >/dev/null \
  || give_up "apt-get failed to install"
