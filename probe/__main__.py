from probe.cli import console_main

console_main()
