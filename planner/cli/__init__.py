"""The command line: `planner estimate|search|compare|recommend|export|run|app|probe|calibrate|validate`."""
