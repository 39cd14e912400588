MODE=$1
/work/main/.venv/bin/python srv.py $MODE > srv.log 2>&1 &
P=$!; sleep 2
c0=$(awk '{print $14+$15}' /proc/$P/stat)
/work/main/.venv/bin/python cli.py
c1=$(awk '{print $14+$15}' /proc/$P/stat)
echo "$MODE server CPU-s $(( c1-c0 ))/100 -> us/msg $(( (c1-c0)*10000/76800 ))"
kill $P
