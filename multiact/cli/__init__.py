"""multiact's user tools, built on the core (op table, reference, registry, dispatch, API): the
`multiact` command (`cli`), benchmarks against peers (`bench`, `peers`), the on-machine
consistency check (`selfcheck`), the machine description (`sysinfo`), report formatting and the
README's generated op table (`docs`)."""
