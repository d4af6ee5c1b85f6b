# Sourced by the scripts beside it: what they need before they build.

# Plugins (the examples, the tests' own) are WebAssembly components built from source.
need_wasm_target() {
    if ! rustup target list --installed | grep -qx wasm32-wasip2; then
        rustup target add wasm32-wasip2
    fi
}

# apt-get install, with `apt-get update` only when the first try fails (stale or missing lists).
apt_install() {
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y --no-install-recommends "$@" \
        || { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends "$@"; }
}

# Real Kafka clients for the Kafka-protocol tests (docs/kafka.md): Debian's kcat (librdkafka
# 2.0.2), and a virtualenv in the target dir (a clean clone reinstalls it) with confluent-kafka
# (its wheel bundles librdkafka 2.x) and kafka-python, and kafkajs from npm. Exports
# MMMQ_KAFKA_PYTHON, the venv's interpreter, and MMMQ_KAFKAJS_NODE_PATH.
KAFKA_PY_REQS="confluent-kafka==2.16.1 kafka-python==2.3.3"
KAFKAJS_VERSION="2.2.4"
need_kafka_clients() {
    command -v kcat >/dev/null || apt_install kcat
    local target="${CARGO_TARGET_DIR:-$PWD/target}"
    local venv="$target/kafka-venv"
    # The stamp names the requirements and the interpreter: change either and it is rebuilt.
    local want
    want="$KAFKA_PY_REQS $(python3 -c 'import sys; print(sys.version.split()[0])')"
    if [ "$(cat "$venv/.mmmq-stamp" 2>/dev/null)" != "$want" ] \
        || ! "$venv/bin/python" -c 'import confluent_kafka, kafka' 2>/dev/null; then
        rm -rf "$venv"
        mkdir -p "$target"
        python3 -m venv "$venv"
        # shellcheck disable=SC2086  # the requirements are words on purpose
        "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input \
            --only-binary=:all: $KAFKA_PY_REQS
        echo "$want" > "$venv/.mmmq-stamp"
    fi
    MMMQ_KAFKA_PYTHON="$(cd "$venv/bin" && pwd)/python"
    export MMMQ_KAFKA_PYTHON
    # kafkajs (npm): a JavaScript client with its own protocol code. Exports
    # MMMQ_KAFKAJS_NODE_PATH, the node_modules that holds it.
    local js="$target/kafkajs"
    if [ "$(cat "$js/.mmmq-stamp" 2>/dev/null)" != "$KAFKAJS_VERSION" ]; then
        command -v npm >/dev/null || apt_install nodejs npm
        rm -rf "$js"
        mkdir -p "$js"
        # A package of its own, so npm installs here and not in a package.json above it.
        echo '{"private": true}' > "$js/package.json"
        (cd "$js" && npm install --silent --no-audit --no-fund "kafkajs@$KAFKAJS_VERSION" >/dev/null)
        echo "$KAFKAJS_VERSION" > "$js/.mmmq-stamp"
    fi
    MMMQ_KAFKAJS_NODE_PATH="$(cd "$js" && pwd)/node_modules"
    export MMMQ_KAFKAJS_NODE_PATH
}
