"""LeRobot v3.0 datasets: the format, writing a version, publishing it atomically, checking it, curating it."""
