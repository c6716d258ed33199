"""One module per tool, each with its argument model and `TOOL`, its ToolDef (tooldef.py). A new
tool is a new module here (and its tests); catalog.py finds it. The contract: docs/tools.md."""
