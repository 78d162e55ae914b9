
[ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
