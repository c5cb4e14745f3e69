#!/bin/sh
# The toolchain the Makefile runs synth, deploy and the tests with (docs/toolchain.md), checked before
# anything is built: one line naming what is wrong and the fix, exit 2.
#   tools/check_toolchain.sh python PYTHON   PYTHON runs and is Python 3.11 (the venv is made from it)
#   tools/check_toolchain.sh venv .venv/bin/python   an existing venv was made with Python 3.11
#   tools/check_toolchain.sh node            `node` on PATH is the major version package.json pins
set -u
want_python=3.11
here=$(dirname "$0")

fail() {
	echo "error: $1" >&2
	exit 2
}

case "${1:-}" in
python | venv)
	python=${2:?usage: check_toolchain.sh python|venv PATH}
	command -v "$python" >/dev/null 2>&1 ||
		fail "$python not found: flotilla needs Python $want_python (constraints.txt is locked on it); install it, or pass PYTHON=/path/to/python$want_python to make"
	got=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
		fail "$python does not run: flotilla needs Python $want_python; pass PYTHON=/path/to/python$want_python to make"
	if [ "$got" != "$want_python" ]; then
		if [ "$1" = venv ]; then
			fail "$python is Python $got, not $want_python: the venv was made with another Python; make clean, then make synth (PYTHON=/path/to/python$want_python)"
		fi
		fail "$python is Python $got, not $want_python: constraints.txt is locked on $want_python; pass PYTHON=/path/to/python$want_python to make"
	fi
	;;
node)
	# package.json's devDependency "node": "22.x.y" is the Node.js npm ci installs into node_modules/node.
	want_node=$(sed -n 's/.*"node": *"\([0-9]*\)\..*/\1/p' "$here/../package.json")
	[ -n "$want_node" ] || fail "package.json pins no \"node\" version: restore its devDependencies"
	got=$(node --version 2>/dev/null) ||
		fail "node not found: run npm ci (it installs Node.js $want_node into node_modules/node, which the Makefile puts first on PATH)"
	case "$got" in
	v"$want_node".*) ;;
	*) fail "node on PATH is $got, not $want_node.x from package.json: run npm ci (node_modules/node/bin goes first on PATH), or make node_modules/.installed" ;;
	esac
	;;
*)
	fail "usage: tools/check_toolchain.sh python PYTHON | venv VENV_PYTHON | node"
	;;
esac
