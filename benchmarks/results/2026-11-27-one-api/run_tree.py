"""Run the blockdraft CLI from the checkout named by $BLOCKDRAFT_TREE, past the editable install's finder."""
import os, sys
tree = os.environ["BLOCKDRAFT_TREE"]
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, tree)
import blockdraft
assert blockdraft.__file__.startswith(tree), blockdraft.__file__
print("code:", blockdraft.__file__, file=sys.stderr)
from blockdraft.cli import main
sys.exit(main(sys.argv[1:]))
