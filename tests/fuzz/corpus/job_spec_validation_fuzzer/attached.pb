
torch-attached=";

0.weight 

0.bias worker-000001worker-000002ü©ñÒMbP? @H