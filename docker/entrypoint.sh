#!/bin/sh
# Export secrets handed over as files: for every VAR_FILE=/path in the
# environment, set VAR to the file's content (the convention of the official
# postgres image). Secrets stay out of the image, the compose file and `ps`.
set -eu
for name in $(env | sed -n 's/^\([A-Z0-9_]*\)_FILE=.*/\1/p'); do
    file=$(printenv "${name}_FILE")
    if [ ! -r "$file" ]; then
        echo "outbox-entrypoint: ${name}_FILE=$file is not readable; mount the secret" >&2
        exit 1
    fi
    export "$name=$(cat "$file")"
    unset "${name}_FILE"
done
exec "$@"
