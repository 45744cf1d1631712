#!/usr/bin/env bash
# Regenerates Lode's TEST-ONLY TLS material (see README.md here): a CA, a server certificate
# it signs for localhost and 127.0.0.1, and an unrelated second CA. ECDSA P-256, 100 years.
# Needs openssl; the tests only read the files this writes.
set -euo pipefail
cd "$(dirname "$0")"
days=36500
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }

new_ca() { # name, common name
    new_key "$1.key"
    openssl req -x509 -new -key "$1.key" -sha256 -days "$days" -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$1.crt"
}

new_ca ca "Lode test CA"
new_ca other-ca "Lode unrelated test CA"

new_key server.key
openssl req -new -key server.key -subj "/CN=localhost" -out "$tmp/server.csr"
cat > "$tmp/server.ext" <<'EXT'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
EXT
openssl x509 -req -in "$tmp/server.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -CAserial "$tmp/ca.srl" -sha256 -days "$days" -extfile "$tmp/server.ext" -out server.crt
openssl verify -CAfile ca.crt server.crt
