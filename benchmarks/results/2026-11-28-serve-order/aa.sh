cd /work/main
for r in 1 2 3; do
  case $r in 1) order="18002 18001 18003";; 2) order="18001 18003 18002";; 3) order="18003 18002 18001";; 4) order="18002 18003 18001";; esac
  for p in $order; do
    tok=$(.venv/bin/blockdraft bench serve --url http://127.0.0.1:$p --prompts humaneval --limit 8 --max-tokens 128 --concurrency 8 --requests-per-point 48 --out /tmp/aa-$p-$r 2>&1 | tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(list(list(d['points'].values())[0].values())[0]['total_tok_s'])")
    echo "round $r port $p total_tok_s $tok"
  done
done
