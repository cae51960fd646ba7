"""The speculative decode loop: prefill, then draft / verify / accept / roll back until done."""
