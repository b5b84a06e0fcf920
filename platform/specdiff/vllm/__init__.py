"""vLLM: the drafter export in the layout vLLM's ``dflash`` method loads, and the plugin vLLM loads beside it. vLLM itself is imported only when vLLM calls in."""
