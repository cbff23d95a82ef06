"""``probe init [DIR]``: an editable config.json and support_wrap_ops.yaml for a project.

Users edit these copies (delete a YAML line to stop dumping an API) instead of files
inside site-packages; the config's ``wrap_ops_yaml`` points at the copy, relative to the
config file (so the folder can be moved or checked in).
"""
import json
import os
import shutil

EXAMPLE_CONFIG = {
    "task": "statistics",
    "dump_path": "./dump_path",
    "rank": [],
    "step": [],
    "level": "L1",
    "async_dump": False,
    "statistics": {
        "scope": [],
        "list": [],
        "data_mode": ["all"],
        "summary_mode": "statistics",
    },
    "tensor": {
        "scope": [],
        "list": [],
        "data_mode": ["all"],
    },
}


def write_init_files(directory=".", force=False):
    """Write ``config.json`` and ``support_wrap_ops.yaml`` into ``directory``; return their paths."""
    os.makedirs(directory, exist_ok=True)
    config_path = os.path.join(directory, "config.json")
    yaml_path = os.path.join(directory, "support_wrap_ops.yaml")
    if not force:
        for path in (config_path, yaml_path):
            if os.path.exists(path):
                raise FileExistsError(f"{path} already exists (use --force to overwrite)")
    from probe.hook_module.registry import DEFAULT_YAML  # torch, only when writing
    shutil.copyfile(DEFAULT_YAML, yaml_path)
    config = dict(EXAMPLE_CONFIG, wrap_ops_yaml=os.path.basename(yaml_path))   # next to config.json
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return [config_path, yaml_path]


def add_arguments(parser):
    parser.add_argument("directory", nargs="?", default=".", help="where to write the files (default: .)")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")


def run(args):
    for path in write_init_files(args.directory, args.force):
        print(path)
    return 0
